"""Launch lines per platform (issue 36): each vendor's devices get their platform's device
variable and engine environment, a stated refusal where an engine does not run there, and
the plan counts chips on a TPU, never CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from perfmodel.cli.app import app
from perfmodel.serving.planner.launch import Checkpoint, Deployment, Server, launch
from perfmodel.serving.planner.platforms import platform, platform_of, unit_of
from perfmodel.specs.errors import SpecError

LLAMA = Checkpoint("meta-llama/Meta-Llama-3-70B-Instruct")


def _two_servers(where: str) -> Deployment:
    return Deployment(LLAMA, Server(tp=2), replicas=2, gpus_per_node=8, platform=where)


def test_rocm_lines_set_hip_devices_and_aiter() -> None:
    vllm = launch(_two_servers("rocm"), "vllm").text()
    assert "VLLM_ROCM_USE_AITER=1 HIP_VISIBLE_DEVICES=2,3 vllm serve" in vllm
    assert "CUDA_VISIBLE_DEVICES" not in vllm
    assert "SGLANG_USE_AITER=1 HIP_VISIBLE_DEVICES=0,1 python -m sglang.launch_server" in \
        launch(_two_servers("rocm"), "sglang").text()


def test_refused_engines_print_no_command() -> None:
    for where, engine in (("rocm", "trtllm"), ("tpu", "trtllm"), ("tpu", "sglang"),
                          ("neuron", "vllm"), ("gaudi", "sglang")):
        run = launch(_two_servers(where), engine)
        assert run.steps == () and run.files == ()
        assert run.notes[0].startswith(f"no launch on {where}: ")


def test_tpu_never_splits_a_host_nor_names_cuda() -> None:
    text = launch(Deployment(LLAMA, Server(tp=2), gpus_per_node=4, platform="tpu"),
                  "vllm").text()
    assert "VISIBLE" not in text and "server on chips 0,1" in text
    assert "runs on a host (VM) of its own size" in text


def test_cuda_lines_unchanged() -> None:
    assert "CUDA_VISIBLE_DEVICES=2,3 vllm serve" in launch(_two_servers("cuda"), "vllm").text()


def test_platform_lookups() -> None:
    assert platform_of("amd").name == "rocm" and platform_of("google").unit == "chip"
    assert unit_of(["nvidia", "amd"]) == "GPU"
    assert unit_of(["nvidia", "google"]) == "device"
    with pytest.raises(SpecError, match="vendor 'other' has no serving platform"):
        platform_of("other")
    with pytest.raises(SpecError, match="platform: expected one of cuda, rocm"):
        platform("cpu")


def test_tpu_plan_counts_chips() -> None:
    out = CliRunner().invoke(app, ["plan", "-m", "llama-3-8b", "-H", "tpu-v6e", "--rate", "2",
                                   "--slo-ttft", "2", "--slo-tpot", "0.1", "--input-len",
                                   "500", "--output-len", "50", "--requests", "100"])
    assert out.exit_code == 0, out.output
    assert "CUDA_VISIBLE_DEVICES" not in out.output and "trtllm-serve" not in out.output
    assert re.search(r"\d+ chips", out.output) and not re.search(r"\d+ GPUs", out.output)
    assert "per GPU" not in out.output and "tok/s/GPU" not in out.output
    assert "no launch on tpu: TensorRT-LLM runs on NVIDIA GPUs only" in out.output
