"""serving.planner.launch: every flag an emitted launch uses is in the committed flag list of its
engine version; hand-derived golden command lines; quantization follows the checkpoint;
a chat workload gets the instruct checkpoint; the flag-list script on a small source."""

import importlib.util
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from perfmodel.serving.planner.launch import (
    ENGINES,
    VERSIONS,
    Checkpoint,
    Deployment,
    Launch,
    LaunchError,
    Server,
    Step,
    launch,
    launches,
)
from perfmodel.serving.planner.launch_data import (
    FLAGS,
    checkpoint,
    emitted_flags,
    flag_list,
    unknown_flags,
)
from perfmodel.specs import load

ROOT = Path(__file__).resolve().parents[1]
DSV3 = Checkpoint("deepseek-ai/DeepSeek-V3", "fp8", "deepseek-ai/DeepSeek-V3-Base")
LLAMA = Checkpoint("meta-llama/Meta-Llama-3-70B-Instruct", "bf16", "meta-llama/Meta-Llama-3-70B")
GPT_OSS = Checkpoint("openai/gpt-oss-120b", "mxfp4")

GRID = {
    "dense TP, replicas": Deployment(LLAMA, Server(tp=4, max_num_seqs=64), replicas=2),
    "dense TP x PP over 2 nodes": Deployment(LLAMA, Server(tp=8, pp=2), weights="bf16"),
    "wide EP, DP attention, 2 nodes": Deployment(DSV3, Server(dp=16, ep=16), weights="fp8"),
    "wide EP, DP attention, 4 nodes x2": Deployment(DSV3, Server(dp=32, ep=32), replicas=2,
                                                    weights="fp8"),
    "TP2 x DP4 EP8 in a node": Deployment(DSV3, Server(tp=2, dp=4, ep=8), weights="fp8"),
    "MXFP4 gpt-oss": Deployment(GPT_OSS, Server(tp=2, ep=2), replicas=4, weights="fp4"),
    "bf16 Llama at W8A8-fp8, fp8 KV": Deployment(LLAMA, Server(tp=2), replicas=4,
                                                 weights="fp8", kv_dtype="fp8"),
    "disaggregated 1P+3D": Deployment(LLAMA, Server(tp=2, max_num_seqs=128), replicas=3,
                                      prefill_replicas=1),
    "disaggregated wide EP decode": Deployment(DSV3, Server(dp=16, ep=16), replicas=1,
                                               prefill_replicas=2, prefill=Server(tp=8, ep=8),
                                               weights="fp8", kv_dtype="fp8"),
    "single GPUs, 4 nodes": Deployment(Checkpoint("Qwen/Qwen3-8B"), Server(), replicas=32),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", GRID)
def test_every_emitted_flag_is_in_the_engine_versions_flag_list(name, engine):
    run = launch(GRID[name], engine)
    assert run.version == VERSIONS[engine]
    assert [s for s in run.steps if s.checked], name
    assert unknown_flags(run) == []


def test_the_check_fails_on_an_unknown_flag_or_choice():
    bad = Launch("sglang", VERSIONS["sglang"], (Step("x", "python -m sglang.launch_server "
                                                     "--tp 4 --kv-cache-dtype fp9"),))
    assert unknown_flags(bad) == ["--tp", "--kv-cache-dtype=fp9"]
    yml = Launch("trtllm", VERSIONS["trtllm"], (), (("a.yaml", "tensor_parallel_sizes: 2\n"
                                                     "cache_transceiver_config:\n"
                                                     "  backend: NIXLL\n"),))
    assert unknown_flags(yml) == ["yaml:tensor_parallel_sizes",
                                  "yaml:cache_transceiver_config.backend=NIXLL"]


def test_committed_flag_lists_name_their_version_and_source():
    for engine, version in VERSIONS.items():
        doc = yaml.safe_load((FLAGS / f"{engine}-{version}.yaml").read_text())
        assert (doc["engine"], doc["version"]) == (engine, version)
        assert doc["count"] == len(doc["flags"]) and doc["source"]
    for engine in ("vllm", "sglang"):
        doc = yaml.safe_load((FLAGS / f"{engine}-{VERSIONS[engine]}.yaml").read_text())
        assert doc["generated_by"] == "reports/engines/make_flag_lists.py"
        assert doc["count"] > 300
    vllm = flag_list("vllm", VERSIONS["vllm"])
    assert "--no-enable-prefix-caching" in vllm and "--tp" not in vllm
    assert "fp8" in vllm["--kv-cache-dtype"]["choices"]
    assert "nixl" in flag_list("sglang", VERSIONS["sglang"])[
        "--disaggregation-transfer-backend"]["choices"]


def _lines(run: Launch) -> list[str]:
    return [s.command for s in run.steps if s.checked]


def test_golden_vllm_wide_ep_over_two_nodes():
    """By hand: 16 attention ranks of TP1 = 16 GPUs = 2 nodes of 8; the experts over TP x
    DP = 16 inside the one server; 1024 sequences over 16 ranks = 64 each; DeepSeek-V3 is
    an fp8 checkpoint, so no --quantization; node 1 is headless and starts at rank 8."""
    dep = Deployment(DSV3, Server(dp=16, ep=16, max_num_seqs=1024), weights="fp8")
    head = ("vllm serve deepseek-ai/DeepSeek-V3 --tensor-parallel-size 1 "
            "--data-parallel-size 16 --enable-expert-parallel --max-num-seqs 64 "
            "--max-num-batched-tokens 8192 --enable-chunked-prefill --scheduling-policy fcfs "
            "--gpu-memory-utilization 0.9 "
            "--data-parallel-size-local 8 --data-parallel-address HEAD_IP "
            "--data-parallel-rpc-port 13345")
    assert _lines(launch(dep, "vllm")) == [
        head + " --port 8000", head + " --headless --data-parallel-start-rank 8"]


def test_golden_sglang_tp_pp_over_two_nodes_with_online_fp8():
    """By hand: TP8 x PP2 = 16 GPUs on 2 nodes; a bf16 checkpoint planned at W8A8-fp8 is
    quantized on load (--quantization fp8); fp8 KV is fp8_e4m3 in SGLang's names."""
    dep = Deployment(LLAMA, Server(tp=8, pp=2, max_num_seqs=64), weights="fp8",
                     kv_dtype="fp8")
    base = ("python -m sglang.launch_server --model-path meta-llama/Meta-Llama-3-70B-Instruct "
            "--tp-size 8 --pp-size 2 --quantization fp8 --kv-cache-dtype fp8_e4m3 "
            "--max-running-requests 64 --chunked-prefill-size 8192 --schedule-policy fcfs "
            "--host 0.0.0.0 "
            "--nnodes 2 --node-rank {r} --dist-init-addr HEAD_IP:5000")
    assert _lines(launch(dep, "sglang")) == [base.format(r=0) + " --port 30000",
                                             base.format(r=1)]


def test_golden_trtllm_attention_dp_config():
    """By hand: TP2 x DP4 attention ranks = 8 GPUs, experts over 8; TensorRT-LLM counts
    every GPU in tensor_parallel_size; 256 sequences over 4 ranks = 64 per rank."""
    run = launch(Deployment(DSV3, Server(tp=2, dp=4, ep=8, max_num_seqs=256),
                            weights="fp8", kv_dtype="fp8"), "trtllm")
    assert run.files == (("extra-llm-api.yaml",
                          "tensor_parallel_size: 8\npipeline_parallel_size: 1\n"
                          "moe_expert_parallel_size: 8\nenable_attention_dp: true\n"
                          "max_batch_size: 64\nmax_num_tokens: 8192\n"
                          "enable_chunked_prefill: true\nscheduler_config:\n"
                          "  capacity_scheduler_policy: GUARANTEED_NO_EVICT\nkv_cache_config:\n"
                          "  free_gpu_memory_fraction: 0.9\n  dtype: fp8\n"),)
    assert _lines(run) == ["mpirun -n 8 trtllm-llmapi-launch trtllm-serve "
                           "deepseek-ai/DeepSeek-V3 --backend pytorch --extra_llm_api_options "
                           "extra-llm-api.yaml --host 0.0.0.0 --port 8000"]


@pytest.mark.parametrize("model", ["gpt-oss-120b", "gpt-oss-20b", "deepseek-v3", "kimi-k2"])
def test_no_quantization_flag_on_a_prequantized_checkpoint(model):
    ckpt = checkpoint(load.model(model))
    assert ckpt.format in ("fp8", "mxfp4")
    weights = {"fp8": "fp8", "mxfp4": "fp4"}[ckpt.format]
    for run in launches(Deployment(ckpt, Server(tp=8, ep=8), weights=weights)).values():
        flags = [f for s in run.steps for f, _ in emitted_flags(s)]
        assert "--quantization" not in flags and not run.notes[:-1]


def test_online_fp8_only_for_a_bf16_checkpoint_planned_at_fp8():
    def quant(dep):
        return [v for s in launch(dep, "vllm").steps for f, v in emitted_flags(s)
                if f == "--quantization"]
    assert quant(Deployment(LLAMA, Server(tp=2), weights="fp8")) == ["fp8"]
    assert quant(Deployment(LLAMA, Server(tp=2), weights="bf16")) == []
    run = launch(Deployment(LLAMA, Server(tp=2), weights="fp8"), "trtllm")
    assert any("ModelOpt" in n for n in run.notes)     # no online fp8 in TensorRT-LLM


def test_chat_workload_serves_the_instruct_checkpoint():
    assert checkpoint(load.model("llama-3-70b")).repo == "meta-llama/Meta-Llama-3-70B-Instruct"
    assert checkpoint(load.model("llama-3-70b"), chat=False).repo == "meta-llama/Meta-Llama-3-70B"
    assert checkpoint(load.model("qwen3-8b")).base == "Qwen/Qwen3-8B-Base"
    assert checkpoint(load.model("gpt-oss-120b"), chat=False).repo == "openai/gpt-oss-120b"
    run = launch(Deployment(checkpoint(load.model("llama-3-8b")), Server()), "vllm")
    words = shlex.split(run.steps[0].command)
    assert words[words.index("serve") + 1] == "meta-llama/Meta-Llama-3-8B-Instruct"


def test_checkpoint_table_matches_the_shipped_models():
    table = yaml.safe_load((ROOT / "perfmodel/serving/planner/checkpoints.yaml").read_text())
    shipped = {p.stem for p in (ROOT / "perfmodel" / "models").glob("*.yaml")} - {"README"}
    assert set(table) <= shipped
    for name, row in table.items():
        m = load.model(name)
        assert row["chat"] or row["base"], name
        if m.quantization is not None:        # a quantized model YAML: the same format
            assert row["format"] == ("mxfp4" if m.quantization.method == "mxfp4"
                                     else m.quantization.weights_dtype), name


def test_a_model_outside_the_table_is_its_source_repository():
    other = replace(load.model("llama-3-8b"), name="my-llama")
    assert checkpoint(other) == Checkpoint("meta-llama/Meta-Llama-3-8B", "bf16")


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"tp": 2, "dp": 2, "ep": 2}, "ep"), ({"dp": 4}, "dp"), ({"tp": 0}, "tp")])
def test_bad_server_shapes_are_one_line_errors(kwargs, field):
    with pytest.raises(LaunchError, match=f"launch: {field}: expected"):
        Server(**kwargs)


def test_a_server_spanning_nodes_unevenly_is_refused():
    with pytest.raises(LaunchError, match="unevenly"):
        Deployment(LLAMA, Server(tp=4, pp=3))


def _script():
    spec = importlib.util.spec_from_file_location(
        "make_flag_lists", ROOT / "reports/engines/make_flag_lists.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


VLLM_FIXTURE = {
    "vllm/_version.py": "__version__ = version = '9.9.9'\n__commit_id__ = commit_id = 'gabc'\n",
    "vllm/config/parallel.py": (
        "from typing import Literal\nB = Literal['mp', 'ray']\n"
        "class ParallelConfig:\n    tensor_parallel_size: int = 1\n"
        "    enable_expert_parallel: bool = False\n    backend: B = 'mp'\n"
        "    maybe: bool | str | None = None\n"),
    "vllm/engine/arg_utils.py": (
        "class EngineArgs:\n    @staticmethod\n    def add_cli_args(parser):\n"
        "        pk = get_kwargs(ParallelConfig)\n        g = parser\n"
        "        g.add_argument('--tensor-parallel-size', '-tp', **pk['tensor_parallel_size'])\n"
        "        g.add_argument('--enable-expert-parallel', **{**pk['enable_expert_parallel'], "
        "'default': None})\n"
        "        g.add_argument('--backend', **pk['backend'])\n"
        "        g.add_argument('--maybe', **pk['maybe'])\n"
        "        g.add_argument('--pick', choices=['a', 'b'])\n"),
    "vllm/entrypoints/openai/cli_args.py": (
        "class BaseFrontendArgs:\n    enable_thing: bool = False\n"
        "class FrontendArgs(BaseFrontendArgs):\n    port: int = 8000\n"
        "def make_arg_parser(parser):\n    parser.add_argument('model_tag')\n"
        "    parser.add_argument('--headless', action='store_true')\n"),
}


def test_flag_list_script_reads_a_vllm_source(tmp_path):
    for path, text in VLLM_FIXTURE.items():
        (tmp_path / "src" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / path).write_text(text)
    _script().main(["vllm", str(tmp_path / "src"), "--out", str(tmp_path / "out")])
    doc = yaml.safe_load((tmp_path / "out" / "vllm-9.9.9.yaml").read_text())
    assert set(doc["flags"]) == {"--tensor-parallel-size", "-tp", "--enable-expert-parallel",
                                 "--no-enable-expert-parallel", "--backend", "--maybe",
                                 "--pick", "--headless", "--enable-thing", "--no-enable-thing",
                                 "--port"}
    assert doc["flags"]["--backend"] == {"choices": ["mp", "ray"]}
    assert "commit gabc" in doc["source"]


def test_flag_list_script_reads_an_sglang_source(tmp_path):
    src = tmp_path / "python" / "sglang" / "srt"
    src.mkdir(parents=True)
    (tmp_path / "python" / "sglang" / "_version.py").write_text("__version__ = '1.2.3'\n")
    (src / "server_args.py").write_text(
        "CH = ['fp8', 'awq']\nclass ServerArgs:\n    model_path: A[str, 'help'] = None\n"
        "    tp_size: A[int, Arg(help='tp', aliases=['--tensor-parallel-size'])] = 1\n"
        "    quantization: A[Optional[str], Arg(help='q', choices=CH)] = None\n"
        "    mode: A[Literal['null', 'prefill'], 'm'] = 'null'\n"
        "    hidden: A[int, Arg(no_cli=True)] = 0\n    plain: int = 0\n"
        "    flag: A[bool, 'f'] = False\n"
        "    @staticmethod\n    def add_cli_args(parser):\n"
        "        parser.add_argument('--config', type=str)\n")
    _script().main(["sglang", str(tmp_path), "--out", str(tmp_path / "out")])
    flags = yaml.safe_load((tmp_path / "out" / "sglang-1.2.3.yaml").read_text())["flags"]
    assert flags == {"--config": {}, "--flag": {}, "--mode": {"choices": ["null", "prefill"]},
                     "--model-path": {}, "--quantization": {"choices": ["fp8", "awq"]},
                     "--tensor-parallel-size": {}, "--tp-size": {}}


def test_plan_winner_spanning_nodes_gets_multi_node_launch_lines():
    """What cli.plan builds from the planner's columns: DeepSeek-V3 over 32 H100s as one
    EP32 server with 32 attention ranks: 4 nodes of 8 (the device's NVLink domain)."""
    from types import SimpleNamespace

    import numpy as np

    from perfmodel.cli.plan import commands, deployment, launch_steps

    cols = {"hardware": ["h100-sxm"], "tp": [1], "ep": [32], "attention_dp": [True],
            "prefill_replicas": [0], "decode_replicas": [1], "batch": [2048],
            "weights_dtype": ["fp8"]}
    won = SimpleNamespace(model=load.model("deepseek-v3"), winner={"index": 0},
                          candidates={k: np.array(v) for k, v in cols.items()})
    dep = deployment(won)
    assert (dep.server.gpus, dep.gpus_per_node, dep.checkpoint.repo) == \
        (32, 8, "deepseek-ai/DeepSeek-V3")
    runs = launch_steps(won)
    assert all(unknown_flags(run) == [] for run in runs.values())
    vllm = commands(won)["vLLM"]
    assert vllm.count("vllm serve") == 4 and vllm.count("--headless") == 3
    assert "--data-parallel-start-rank 24" in vllm and "--quantization" not in vllm
    assert commands(won)["SGLang"].count("--nnodes 4 --node-rank") == 4
