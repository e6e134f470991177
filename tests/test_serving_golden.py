"""Byte-identical outputs of ``perfmodel simulate`` and ``perfmodel plan`` on fixed cases.

The hashes in ``tests/data/serving_golden.json`` were taken on the tree before the serving
package was split into rooms (``serving/engines``, ``serving/fleet``, ``serving/planner``,
issue 34) and hold across it: moving code must not move a byte of what the commands print
or write. Each case runs in process through typer's runner; stdout and each file ``--out``
writes (CSV and JSON; the figures are left out: their bytes follow matplotlib, not us) are
hashed. The one varying line, the planner's own wall time ("planned in 0.8 s"), is masked.

A change that is meant to move the numbers regenerates the hashes, and says so in its
commit: ``python -m tests.test_serving_golden``.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfmodel.cli.app import app

GOLDEN = Path(__file__).parent / "data" / "serving_golden.json"
QUIET = ["--no-progress"]
SIM = ["simulate", *QUIET, "--no-band", "--seed", "3"]
SMALL = ["--num-requests", "48", "--input-len", "384", "--output-len", "48",
         "--length-dist", "lognormal"]
CASES = {
    # vLLM v1: a shared prefix in the prefix cache, --out files; a small KV pool (preemption)
    "vllm-out": [*SIM, "-m", "llama-3.1-8b", "-H", "h100-sxm", "--rate", "12", *SMALL,
                 "--shared-prefix", "128", "--max-num-seqs", "32", "--out", "{out}"],
    "vllm-preempt": [*SIM, "-m", "llama-3.1-8b", "-H", "a100-40gb-sxm", "--rate", "40",
                     "--num-requests", "48", "--input-len", "512", "--output-len", "256",
                     "--gpu-memory-utilization", "0.45", "-f", "json"],
    # vLLM's 80% band: the run again at each edge
    "vllm-band-json": ["simulate", *QUIET, "-m", "llama-3.1-8b", "-H", "a100-80gb-sxm",
                       "--rate", "6", "--num-requests", "24", "--input-len", "256",
                       "--output-len", "24", "-f", "json"],
    "vllm-static": [*SIM, "-m", "llama-3.1-8b", "-H", "h100-sxm", "--rate", "8", *SMALL,
                    "--scheduler", "static", "--max-num-seqs", "16", "-f", "json"],
    # SGLang: radix cache, longest-prefix-first, mixed chunks
    "sglang-json": [*SIM, "-m", "llama-3.1-8b", "-H", "h100-sxm", "--engine", "sglang",
                    "--rate", "12", *SMALL, "--shared-prefix", "64",
                    "--schedule-policy", "lpm", "--enable-mixed-chunk", "-f", "json"],
    "sglang-out": [*SIM, "-m", "llama-3.1-8b", "-H", "h100-sxm", "--engine", "sglang",
                   "--engine-mode", "no-overlap", "--rate", "16", *SMALL,
                   "--max-running-requests", "24", "--out", "{out}"],
    # TensorRT-LLM: both capacity policies
    "trtllm-table": [*SIM, "-m", "llama-3.1-8b", "-H", "h100-sxm", "--engine", "trtllm",
                     "--rate", "12", *SMALL],
    "trtllm-maxutil-out": [*SIM, "-m", "llama-3.1-8b", "-H", "h100-sxm", "--engine",
                           "trtllm", "--capacity-scheduler-policy", "MAX_UTILIZATION",
                           "--rate", "16", *SMALL, "--max-batch-size", "24",
                           "--out", "{out}"],
    # replicas behind routers: dealt ahead, and load-aware in lockstep
    "dp-round-robin": [*SIM, "-m", "llama-3.1-8b", "-H", "h100-sxm", "--dp", "2",
                       "--rate", "20", *SMALL, "-f", "json"],
    "dp-least-tokens-out": [*SIM, "-m", "llama-3.1-8b", "-H", "h100-sxm", "--dp", "3",
                            "--router", "least-tokens", "--rate", "24", *SMALL,
                            "--out", "{out}"],
    # conversations: turns, think time, session affinity
    "sessions": [*SIM, "-m", "llama-3.1-8b", "-H", "h100-sxm", "--dp", "2", "--router",
                 "session-affinity", "--rate", "6", "--num-requests", "16", "--turns", "3",
                 "--think-time", "0.5", "--input-len", "256", "--output-len", "32",
                 "-f", "json"],
    # pipeline parallelism (vLLM's batch queue)
    "pp-out": [*SIM, "-m", "llama-3-70b", "-H", "h100-sxm", "--tp", "2", "--pp", "2",
               "--rate", "4", "--num-requests", "32", "--input-len", "512",
               "--output-len", "32", "--out", "{out}"],
    # MoE with data-parallel attention: ranks in lockstep
    "moe-attention-dp": [*SIM, "-m", "deepseek-v2-lite", "-H", "h100-sxm", "--ep", "2",
                         "--attention-dp", "--rate", "8", "--num-requests", "32",
                         "--input-len", "256", "--output-len", "32", "-f", "json"],
    # the planner: aggregated (text), and a disaggregated plan (JSON and --out)
    "plan-text": ["plan", *QUIET, "-m", "llama-3.1-8b", "-H", "h100-sxm", "--slo-ttft",
                  "0.5", "--slo-tpot", "0.05", "--rate", "20", "--input-len", "512",
                  "--output-len", "64", "--requests", "100"],
    "plan-disagg-out": ["plan", *QUIET, "-m", "llama-3-70b", "-H", "h100-sxm", "--slo-ttft",
                        "2", "--slo-tpot", "0.03", "--rate", "10", "--input-len", "4096",
                        "--output-len", "256", "--requests", "100", "-f", "json",
                        "--out", "{out}"],
}
MASKS = (re.compile(rb"planned in [0-9.]+ s"),)


def _digest(data: bytes) -> str:
    for mask in MASKS:
        data = mask.sub(b"<masked>", data)
    return hashlib.sha256(data).hexdigest()


def outputs(name: str, folder: Path) -> dict[str, str]:
    """Case ``name`` run in process: {"stdout" or a file's name: its sha256}."""
    out = folder / name
    args = [a.replace("{out}", str(out)) for a in CASES[name]]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, f"{name}: {result.output}"
    got = {"stdout": _digest(result.stdout.replace(str(out), "{out}").encode())}
    if out.is_dir():
        got |= {p.name: _digest(p.read_bytes()) for p in sorted(out.iterdir())
                if p.suffix in (".csv", ".json")}
    return got


@pytest.mark.parametrize("name", sorted(CASES))
def test_outputs_are_byte_identical(name: str, tmp_path: Path) -> None:
    want = json.loads(GOLDEN.read_text())[name]
    assert outputs(name, tmp_path) == want


def test_every_case_has_a_golden() -> None:
    assert sorted(json.loads(GOLDEN.read_text())) == sorted(CASES)


if __name__ == "__main__":      # regenerate: python -m tests.test_serving_golden
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        hashes = {name: outputs(name, Path(tmp)) for name in sorted(CASES)}
    GOLDEN.write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN} ({len(hashes)} cases)")
