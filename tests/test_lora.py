"""LoRA adapters: the kernels' FLOPs and bytes against hand-derived goldens, the step time by
rank and adapter count, the engines' slots (loads and LRU evictions counted by hand), the KV
pool the slots take, the trace column and the CLI."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.cost import lora as kernels
from perfmodel.serving import traffic
from perfmodel.serving.engines.lora import LoraSettings, LoraSlots, assign, host_link
from perfmodel.serving.engines.sglang import SGLangConfig
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.serving.pricing import kv_pool
from perfmodel.serving.simulate import simulate
from perfmodel.serving.trace import read_trace, write_trace
from perfmodel.specs.errors import SpecError

runner = CliRunner()
M, HW = pm.model("llama-3-8b"), pm.hardware("h100-sxm")

# Llama-3-8B: d 4096, 32 heads and 8 KV heads of 128 (q 4096, k = v = 1024), MLP 14336,
# 32 layers. Per layer and per unit of rank, one adapter's A and B elements:
#   qkv_proj: A 3 x 4096, B 4096 + 1024 + 1024 = 6144;  o_proj: A 4096, B 4096
#   gate_up:  A 2 x 4096, B 2 x 14336 = 28672;          down:   A 14336, B 4096
# = 12288 + 6144 + 4096 + 4096 + 8192 + 28672 + 14336 + 4096 = 81920
PER_RANK_LAYER = 81920
ADAPTER_R16 = PER_RANK_LAYER * 16 * 32 * 2          # bf16: 83,886,080 bytes


def test_adapter_bytes_golden():
    assert kernels.adapter_bytes(M, 1, kernels.MODULES, 16) == ADAPTER_R16 == 83_886_080
    # TP 2: column layers keep A whole and halve B, row layers halve A and keep B:
    # qkv A 12288 B 3072, o A 2048 B 4096, gate_up A 8192 B 14336, down A 7168 B 4096
    assert kernels.adapter_bytes(M, 2, kernels.MODULES, 16) == 55296 * 16 * 32 * 2
    # q and v only: one qkv launch of two slices: A 2 x 4096, B 4096 + 1024
    assert kernels.adapter_bytes(M, 1, ("q_proj", "v_proj"), 8) == (8192 + 5120) * 8 * 32 * 2


def test_decode_flops_and_bytes_golden():
    """Decode, 64 tokens over 4 adapters, rank 16, all seven modules."""
    cost = kernels.step_cost(M, HW, 1, kernels.MODULES, 16, [64], [4], "graph")
    # FLOPs: 2 x tokens x rank x (every A's and B's elements per rank) per layer
    assert cost.flops.sum() == 2 * 64 * 16 * PER_RANK_LAYER * 32 == 5_368_709_120
    # bytes per layer: the 4 adapters' weights; shrink inputs 64 x (3 x 4096 + 14336) x 2;
    # shrink outputs 64 x (48 + 16 + 32 + 16) x 2; expand inputs 4 x 64 x 16 x 2; expand
    # outputs 64 x (6144 + 4096 + 28672 + 4096) x 2
    acts = 128 * (26624 + 112 + 64 + 43008)
    assert cost.bytes.sum() == 4 * ADAPTER_R16 + acts * 32 == 621_477_888
    assert len(cost.names) == 8 and cost.names[0] == "lora_shrink.qkv_proj"


def test_step_time_grows_with_rank_and_adapters():
    tokens, adapters = np.full(3, 64), np.array([1, 4, 16])
    times = np.array([kernels.step_cost(M, HW, 1, kernels.MODULES, r, tokens, adapters,
                                        "graph").time for r in (8, 16, 64)])
    assert np.all(np.diff(times, axis=0) > 0) and np.all(np.diff(times, axis=1) > 0)
    assert np.all(np.isfinite(times)) and times.min() > 0
    # FLOPs do not depend on how the tokens split over adapters; the weight bytes do
    c = kernels.step_cost(M, HW, 1, kernels.MODULES, 16, tokens, adapters)
    assert np.ptp(c.flops.sum(axis=0)) == 0
    assert np.allclose(np.diff(c.bytes.sum(axis=0)), np.diff(adapters) * ADAPTER_R16)


def test_no_adapter_tokens_run_no_kernel():
    cost = kernels.step_cost(M, HW, 1, kernels.MODULES, 16, [0, 64], [0, 2])
    assert cost.time[0] == 0 and cost.flops[:, 0].sum() == 0 and cost.time[1] > 0


def test_modules_checked():
    with pytest.raises(SpecError, match="--lora-modules: 'qproj' is not a LoRA target"):
        kernels.check_modules(("qproj",))
    with pytest.raises(SpecError, match="MLA attention"):
        kernels.linears(pm.model("deepseek-v3"), 1, ("q_proj",))


def test_lru_slots_by_hand():
    """Adapters 0..7 round-robin, one request per step, 4 slots: every request after the
    first four finds its adapter evicted (LRU evicts exactly the one it will need next)."""
    adapter = np.arange(16) % 8
    s = LoraSlots(LoraSettings(max_loras=4, max_cpu_loras=8), adapter)
    for r in range(16):
        s.step(np.array([r]))
    assert (s.loads, s.evictions, s.disk_loads) == (16, 12, 8)
    s = LoraSlots(LoraSettings(max_loras=8), adapter)
    for r in range(16):
        s.step(np.array([r]))
    assert (s.loads, s.evictions, s.disk_loads) == (8, 0, 8)
    # a popular adapter stays: 0, 1, 0, 2, 0, 3 over 2 slots loads 0 once
    s = LoraSlots(LoraSettings(max_loras=2), np.array([0, 1, 0, 2, 0, 3]))
    for r in range(6):
        s.step(np.array([r]))
    assert (s.loads, s.evictions) == (4, 2)


def test_admission_limit():
    s = LoraSlots(LoraSettings(max_loras=2), np.array([0, 1, 2, -1, 1]))
    chosen: set[int] = set()
    for r in (0, 1):
        assert s.admits(r, chosen)
        s.join(r, chosen)
    assert not s.admits(2, chosen) and s.admits(3, chosen) and s.admits(4, chosen)


def _burst(n: int = 16, adapters: int = 8):
    reqs = traffic.generate(n, rate=1e6, input_len=64, output_len=8)
    return assign(reqs, adapters, "round-robin")


@pytest.mark.parametrize("engine", [
    EngineConfig(lora=LoraSettings(max_loras=4, max_cpu_loras=8)),
    SGLangConfig(lora=LoraSettings(max_loras=4, engine="sglang"))])
def test_eight_adapters_over_four_slots(engine):
    """16 requests at once naming adapters 0..7 round-robin, 4 slots: the first wave takes
    the requests of adapters 0..3 (0-3 and 8-11: the others are skipped, not blocking), the
    second wave 4..7 when they finish: 4 + 4 loads, 4 evictions."""
    res = simulate(M, HW, _burst(), engine=engine)
    q = res.summary()["lora"]
    assert (q["adapters"], q["loads"], q["evictions"]) == (8, 8, 4)
    assert q["load_s"] == pytest.approx(8 * ADAPTER_R16 / 64e9)
    first = res.scheduled_s
    assert np.all(first[[0, 1, 2, 3, 8, 9, 10, 11]] < first[[4, 5, 6, 7, 12, 13, 14, 15]].min())


def test_serial_trace_loads_every_request():
    reqs = assign(traffic.generate(16, rate=1.0, arrival="constant", input_len=64,
                                   output_len=8), 8, "round-robin")
    on = EngineConfig(lora=LoraSettings(max_loras=4, max_cpu_loras=8))
    q = simulate(M, HW, reqs, engine=on).summary()["lora"]
    assert (q["loads"], q["evictions"], q["disk_loads"]) == (16, 12, 8)


def test_loads_and_kernels_lengthen_steps():
    reqs = traffic.generate(4, rate=1.0, arrival="constant", input_len=64, output_len=16)
    off = simulate(M, HW, reqs)
    base = simulate(M, HW, reqs, engine=EngineConfig(lora=LoraSettings()))
    on = simulate(M, HW, assign(reqs, 1, "uniform"), engine=EngineConfig(lora=LoraSettings()))
    assert np.allclose(base.ttft_s, off.ttft_s)     # no request names an adapter
    # one load (84 MB over PCIe Gen5, 1.31 ms) on the first request's prefill, then kernels
    gap = on.ttft_s - off.ttft_s
    assert gap[0] > ADAPTER_R16 / 64e9 > gap[1] > 0
    assert np.all(on.tpot_s > off.tpot_s)


def test_slots_come_out_of_the_kv_pool():
    w = pm.Workload.for_model(M)
    plan = pm.Parallelism()
    off = kv_pool(M, HW, plan, w, EngineConfig())
    on = kv_pool(M, HW, plan, w, EngineConfig(lora=LoraSettings(max_loras=4, max_lora_rank=64)))
    reserved = 4 * 4 * ADAPTER_R16
    assert on.weights_bytes - off.weights_bytes == reserved
    left = off.blocks * off.bytes_per_block       # within one block of what was left
    assert off.blocks - on.blocks == pytest.approx(reserved / off.bytes_per_block, abs=1)
    assert left > 0


def test_host_link_from_the_hardware_host_block():
    assert host_link(HW) == (64e9, "")            # h100-sxm.yaml host: 64 GB/s (PCIe Gen5)
    assert host_link(pm.hardware("a40"))[0] == 32e9
    rate, warning = host_link(pm.hardware("tpu-v5e"))
    assert rate == 32e9 and "tpu-v5e has no host: block" in warning


def test_trace_column_round_trip(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,input_tokens,output_tokens,lora_id\n0,8,2,sql\n1,8,2,\n"
                    "2,8,2,chat\n3,8,2,sql\n")
    reqs = read_trace(path)
    assert reqs.adapter.tolist() == [0, -1, 1, 0]
    write_trace(reqs, tmp_path / "u.csv")
    assert read_trace(tmp_path / "u.csv").adapter.tolist() == [0, -1, 1, 0]
    assert read_trace(tmp_path / "u.csv").take(np.array([2, 3])).adapter.tolist() == [1, 0]


def _cli(*args):
    return runner.invoke(app, ["simulate", "--model", "llama-3-8b", "--hardware", "h100-sxm",
                               "--no-progress", "--no-band", *args])


def test_cli_trace_of_eight_adapters(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,input_tokens,output_tokens,lora_id\n" + "".join(
        f"{i},64,8,a{i % 8}\n" for i in range(16)))
    res = _cli("--trace", str(path), "--max-loras", "4", "--max-cpu-loras", "8", "-f", "json")
    assert res.exit_code == 0, res.output
    q = json.loads(res.output[res.output.index("{"):])["lora"]
    assert (q["adapters"], q["loads"], q["evictions"], q["disk_loads"]) == (8, 16, 12, 8)
    off = _cli("--trace", str(path))
    assert off.exit_code != 0 and "LoRA is off" in off.output
    assert len(off.output.strip().splitlines()) == 1


def test_cli_generated_and_flags():
    res = _cli("--rate", "50", "--num-requests", "40", "--loras", "8", "--lora-dist",
               "round-robin", "--max-loras", "4", "--input-len", "64", "--output-len", "8")
    assert res.exit_code == 0, res.output
    assert "--enable-lora --max-loras 4 --max-lora-rank 16" in res.output
    assert "8 adapters over 4 slots of rank 16" in res.output
    sgl = _cli("--engine", "sglang", "--rate", "50", "--num-requests", "20", "--loras", "3",
               "--max-loras-per-batch", "2", "--lora-paths", "a,b", "--input-len", "64",
               "--output-len", "8")
    assert sgl.exit_code != 0 and "--lora-paths: 2 adapter(s) loaded" in sgl.output
    for args, message in ((("--engine", "sglang", "--max-loras", "2"), "--max-loras: applies"),
                          (("--max-loras-per-batch", "2"), "--max-loras-per-batch: applies"),
                          (("--max-loras", "0"), "--max-loras: expected an integer >= 1"),
                          (("--max-lora-rank", "12"), "--max-lora-rank: vLLM takes one of"),
                          (("--loras", "4", "--lora-dist", "pareto"), "--lora-dist: expected"),
                          (("--engine", "trtllm", "--loras", "2"), "LoRA is modelled for"),
                          (("--max-loras", "4", "--max-cpu-loras", "2"),
                           "--max-cpu-loras: expected at least")):
        bad = _cli("--rate", "5", "--num-requests", "4", *args)
        assert bad.exit_code != 0 and message in bad.output, (args, bad.output)
        assert "Traceback" not in bad.output


@pytest.mark.parametrize("engine", [
    EngineConfig(lora=LoraSettings(max_loras=3, max_cpu_loras=6)),
    SGLangConfig(lora=LoraSettings(max_loras=3, engine="sglang"))])
def test_look_ahead_matches_one_step_at_a_time(engine, monkeypatch):
    """Steps priced ahead on forks (the slots copied with the state) give the same run as
    steps priced one by one: a queue of requests skipped for their adapters stays open to
    an arrival naming one of the step's."""
    from perfmodel.serving import engine_loop

    reqs = assign(traffic.generate(80, rate=40.0, input_len=512, output_len=64,
                                   length_dist="lognormal", seed=1), 12, "zipf")
    ahead = simulate(M, HW, reqs, engine=engine)
    monkeypatch.setattr(engine_loop, "LOOKAHEAD", 1)
    one = simulate(M, HW, reqs, engine=engine)
    assert np.array_equal(ahead.ttft_s, one.ttft_s) and np.array_equal(ahead.e2e_s, one.e2e_s)
    assert ahead.summary()["lora"] == one.summary()["lora"]
    assert ahead.summary()["lora"]["evictions"] > 0 and ahead.queue_s.max() > 0.1
    assert ahead.info["price_calls"] < one.info["price_calls"]
