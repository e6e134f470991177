"""An error message never quotes a file's contents (issue 33, finding 1): every loader a
path can reach (model, hardware and its ``base:``, trace and lengths, prices, engine
profile), given files that are not what it expects, names the file, the field or column it
expected and at most a count, never a secret planted in the file's keys, values or lines."""

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfmodel.cli.app import app
from perfmodel.serving import traces
from perfmodel.serving.host_time import load_profile
from perfmodel.serving.planner.prices import read_prices
from perfmodel.serving.trace import read_trace
from perfmodel.specs import load
from perfmodel.specs.errors import SpecError

SECRET = "CANARY7731sk"
FILES = {   # name -> text: the shapes a file that is not ours takes
    "environ.txt": f"SECRET={SECRET}\x00PATH=/bin",
    "passwd.csv": f"root:x:0:0:{SECRET}:/root:/bin/bash\n",
    "key.pem": f"-----BEGIN PRIVATE KEY-----\n{SECRET}\n",
    ".env.yaml": f"API_KEY={SECRET}\n",
    "keys.yaml": f"{SECRET}: 1\nother: 2\n", "keys.json": json.dumps({SECRET: 1, "b": 2}),
    "values.yaml": f"version: {SECRET}\nname: {SECRET}\n",
    "values.json": json.dumps({"version": SECRET, "name": SECRET}),
    "hf.json": json.dumps({"model_type": SECRET}),
    "hf-key.json": json.dumps({"model_type": "llama", SECRET: 1}),
    "alias.yaml": f"a: *{SECRET}\n", "tag.yaml": f"a: !{SECRET} 1\n",
    "dup.yaml": f"{SECRET}: 1\n{SECRET}: 2\n",
    "dup.json": f'{{"{SECRET}": 1, "{SECRET}": 2}}',
    "nested.yaml": f"version: 1\ncompute: {{{SECRET}: 1}}\n",
    "broken.yaml": f"a: b\n{SECRET} c: [\n", "list.yaml": f"- {SECRET}\n",
    "cell.csv": f"arrival_s,input_tokens,output_tokens\n{SECRET},1,1\n",
    "prefix.csv": "arrival_s,input_tokens,output_tokens,prefix_id,prefix_tokens\n"
                  f"0,10,1,{SECRET},2\n1,10,1,{SECRET},3\n",
    "mooncake.jsonl": json.dumps({"timestamp": SECRET, "input_length": 1, "output_length": 1,
                                  "hash_ids": []}) + "\n",
    "mooncake-len.jsonl": json.dumps({"timestamp": 0, "input_length": SECRET,
                                      "output_length": 1}) + "\n",
    "mooncake-hash.jsonl": json.dumps({"timestamp": 0, "input_length": 1, "output_length": 1,
                                       "hash_ids": {SECRET: 1}}) + "\n",
    "azure.csv": f"TIMESTAMP,ContextTokens,GeneratedTokens\n{SECRET},1,1\n",
    "azure-tokens.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                        f"2024-05-10 00:00:00,{SECRET},1\n",
    "burstgpt.csv": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    f"{SECRET},ChatGPT,1,1,2,API log\n",
    "sharegpt.json": json.dumps([{"id": SECRET, "conversations": [{"value": 1}, SECRET]}]),
    "sharegpt-top.json": json.dumps([{SECRET: [SECRET]}]),
    "band.yaml": f"version: 1\nuncertainty: {{{SECRET}: 1}}\n",
    "base-name.yaml": f"version: 1\nbase: {SECRET}\n",
    "base-path.yaml": "version: 1\nbase: keys.yaml\n",
    "base-up.yaml": "version: 1\nbase: ../files/keys.yaml\n",
    "unit.yaml": f"version: 1\nname: x\ncompute:\n  peak_flops_per_s: {{bf16: {SECRET} TFLOPS}}\n",
}
LOADERS = {"model": load.model, "hardware": load.hardware, "trace": read_trace,
           "prices": read_prices, "profile": load_profile,
           # the public trace readers, told the format or left to tell it (issue 35)
           "trace-auto": lambda p: traces.read(p),
           **{f"trace-{f}": (lambda p, f=f: traces.read(p, f)) for f in traces.FORMATS}}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("files") / "files"
    folder.mkdir()
    for name, text in FILES.items():
        (folder / name).write_text(text)
    (folder / "latin1.yaml").write_bytes(b"\xff\xfe" + SECRET.encode())
    return folder


@pytest.mark.parametrize("loader", LOADERS)
def test_no_loader_quotes_a_file(files, loader):
    answered = 0
    for path in sorted(files.iterdir()):
        try:
            LOADERS[loader](Path(path))
            continue
        except SpecError as exc:
            message = str(exc)
        assert SECRET not in message, (loader, path.name, message)
        assert "\n" not in message and str(path) in message
        answered += 1
    assert answered >= len(FILES) - 2


def test_the_messages_stay_useful(files):
    def message(fn, name):
        with pytest.raises(SpecError) as exc:
            fn(files / name)
        return str(exc.value)

    assert "header column 1 of 1 is not a trace column (expected arrival_s" in \
        message(read_trace, "passwd.csv")
    assert "(top level): 2 unknown fields (expected " in message(load.load_model, "keys.yaml")
    assert "not valid YAML (line 1, column 4)" in message(load.load_model, "alias.yaml")
    assert "not valid YAML: a field given twice (line 2" in message(load.load_model,
                                                                    "dup.yaml")
    assert "version: expected an integer, got text of 12 characters" in \
        message(load.load_model, "values.yaml")
    assert "base: not a shipped hardware name" in message(load.load_hardware,
                                                          "base-name.yaml")
    assert "(byte 0 is not UTF-8 text)" in message(load.load_model, "latin1.yaml")


@pytest.mark.parametrize("args", [
    ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm", "--trace", "{f}/environ.txt"],
    ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm", "--trace", "{f}/passwd.csv"],
    ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm", "--trace", "{f}/mooncake.jsonl"],
    ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm", "--trace", "{f}/azure.csv"],
    ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm", "--trace", "{f}/burstgpt.csv"],
    ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm", "--trace", "{f}/sharegpt.json",
     "--rate", "1"],
    ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm", "--trace", "{f}/passwd.csv",
     "--trace-format", "azure"],
    ["plan", "-m", "llama-3-8b", "-H", "h100-sxm", "--slo-ttft", "1", "--slo-tpot", "0.1",
     "--trace", "{f}/keys.json", "--trace-format", "mooncake"],
    ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm", "--rate", "1",
     "--lengths-from", "{f}/key.pem"],
    ["estimate", "-m", "{f}/keys.yaml", "-H", "h100-sxm"],
    ["estimate", "-m", "llama-3-8b", "-H", "{f}/keys.json"],
    ["estimate", "-m", "llama-3-8b", "-H", "{f}/base-up.yaml"],
    ["plan", "-m", "llama-3-8b", "-H", "h100-sxm", "--prices", "{f}/values.yaml",
     "--objective", "cost"],
])
def test_the_cli_quotes_no_file(files, args):
    result = CliRunner().invoke(app, [a.replace("{f}", str(files)) for a in args])
    assert result.exit_code == 2, result.output
    assert SECRET not in result.output
    assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="no /proc")
def test_the_cli_does_not_echo_its_environment():
    entries = [e for e in Path("/proc/self/environ").read_bytes().decode(errors="replace")
               .split("\0") if len(e) > 6]
    result = CliRunner().invoke(app, ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm",
                                      "--trace", "/proc/self/environ"])
    assert result.exit_code == 2 and "is not a trace column" in result.output
    assert entries and not any(e in result.output for e in entries)
