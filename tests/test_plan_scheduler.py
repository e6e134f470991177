"""The plan prints each engine's scheduler settings for the chosen plan, in the engine's
own names (``serving.planner.scheduler_flags``): vLLM and SGLang flags, TensorRT-LLM's
extra-llm-api YAML keys; the same values the launch lines carry."""

import json

import yaml

from perfmodel.serving.planner.launch import Checkpoint, Deployment, Server, launch
from perfmodel.serving.planner.launch_data import emitted_flags
from tests.test_plan_cli import ASK, LENGTHS, _run


def test_each_engine_says_its_scheduler_as_it_takes_it():
    dep = Deployment(Checkpoint("Qwen/Qwen3-8B"), Server(tp=2, max_num_seqs=96,
                                                         max_num_batched_tokens=4096))
    vllm, sglang, trt = (launch(dep, e) for e in ("vllm", "sglang", "trtllm"))
    assert vllm.scheduler == ("(server): --max-num-seqs 96 --max-num-batched-tokens 4096 "
                              "--enable-chunked-prefill --scheduling-policy fcfs",)
    assert sglang.scheduler == ("(server): --max-running-requests 96 --chunked-prefill-size "
                                "4096 --schedule-policy fcfs",)
    assert trt.scheduler == ("(server, extra-llm-api.yaml): max_batch_size: 96, "
                             "max_num_tokens: 4096, enable_chunked_prefill: true, "
                             "scheduler_config.capacity_scheduler_policy: GUARANTEED_NO_EVICT",)
    flags = dict(emitted_flags(vllm.steps[0]))            # the command carries the same
    assert flags["--max-num-seqs"] == "96" and flags["--scheduling-policy"] == "fcfs"
    body = yaml.safe_load(trt.files[0][1])
    assert body["scheduler_config"] == {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT"}
    assert body["enable_chunked_prefill"] is True and body["max_num_tokens"] == 4096


def test_plan_prints_the_chosen_plans_scheduler_per_engine():
    r = _run(*ASK, *LENGTHS, "-f", "json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    batch = data["plan"]["max_num_seqs"]
    launch_ = data["launch"]
    assert launch_["vllm"]["scheduler"][0].endswith(
        f"--max-num-seqs {batch} --max-num-batched-tokens 8192 --enable-chunked-prefill "
        "--scheduling-policy fcfs")
    assert f"--max-running-requests {batch}" in launch_["sglang"]["scheduler"][0]
    assert "capacity_scheduler_policy: GUARANTEED_NO_EVICT" in launch_["trtllm"]["scheduler"][0]
    text = _run(*ASK, *LENGTHS)
    assert text.exit_code == 0, text.output
    for line in (f"# scheduler (server): --max-num-seqs {batch} ",
                 f"# scheduler (server): --max-running-requests {batch} ",
                 "# scheduler (server, extra-llm-api.yaml): max_batch_size: "):
        assert line in text.stdout, line
