"""KV offload tiers (``serving.kvtiers``): a multi-turn trace whose second turns the GPU's
prefix cache alone misses and the CPU tier hits, checked against a capacity boundary
derived by hand, and the tiers' own rules (LRU, write policy, load overlap).

The trace (``_trace``): N sessions' first turns of P = 1024 prompt tokens and 1 output
token, one a second; each leaves a chain of 1024 computed tokens = 64 full blocks of 16
tokens. Two unshared prompts of (B - 40) x 16 tokens (B: the GPU pool's blocks) then fill
the pool twice, evicting every cached chain from the GPU. Then all N second turns arrive
at once, each the 1025 tokens so far plus 14 new ones: 1039 tokens, 64 full blocks of
which are the session's chain (1039 // 16 = 64, so the chain does not grow and a finished
second turn stores nothing new). Llama-3-8B in bf16 holds 2 x 32 layers x 8 KV heads x 128
x 2 bytes = 131,072 bytes per token: 2,097,152 bytes per block.

- GPU only: every second turn misses (0 hit tokens).
- A CPU tier of 4 x 64 blocks (and half a block: the floor is 256 blocks) holds the four
  chains of N = 4 sessions exactly: every second turn hits 64 blocks = 1024 tokens from the
  CPU, loading 4 x 64 x 2,097,152 B = 536,870,912 B over 64 GB/s (H100's PCIe Gen5 x16 per
  direction): 8.388608 ms.
- N = 5 with the same tier: storing session 4's chain evicts the least recently used,
  session 0's, whole (64 blocks over): session 0's second turn misses, the other four hit.
"""

import json
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from perfmodel.cli.app import app
from perfmodel.serving import kvtiers, sessions
from perfmodel.serving.engines import engine_config
from perfmodel.serving.engines.state import Batch
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.serving.pricing import StepPricer
from perfmodel.serving.requests import Requests
from perfmodel.serving.simulate import simulate
from perfmodel.specs import load
from perfmodel.specs.workload import Parallelism, Workload

P, GROWTH, BLOCK_BYTES, LINK = 1024, 14, 2_097_152.0, 64e9
# the engines' settings that give a small GPU pool (B blocks) on an H100 for Llama-3-8B
ENGINES = {"vllm": (lambda: EngineConfig(gpu_memory_utilization=0.23), 341),
           "sglang": (lambda: engine_config("sglang", mem_fraction_static=0.2,
                                            page_size=16), 497)}
CPU_4 = (4 * 64 + 0.5) * BLOCK_BYTES        # four chains of 64 blocks
runner = CliRunner()


def _rows(n: int, pool: int) -> list[tuple]:
    """(arrival_s, input_tokens, output_tokens, session, turn) of the trace above."""
    rows = [(float(s), P, 1, f"s{s}", 1) for s in range(n)]
    rows += [(n + f, (pool - 40) * 16, 1, "", 0) for f in (1.0, 2.0)]
    return rows + [(n + 4.0, P + 1 + GROWTH, 1, f"s{s}", 2) for s in range(n)]


def _trace(n: int, pool: int) -> Requests:
    arr, inp, out, ses, turn = map(list, zip(*_rows(n, pool), strict=True))
    k = len(arr)
    none = np.full(k, -1, np.int64)
    plain = Requests(np.array(arr), np.array(inp, np.int64), np.array(out, np.int64), none,
                     np.zeros(k, np.int64))
    return sessions.attach(plain, ses, turn, "test")


def _run(engine: str, n: int, off: kvtiers.Offload | None):
    make, pool = ENGINES[engine]
    hw = load.hardware("h100-sxm", engine)
    res = simulate(load.model("llama-3-8b"), hw, _trace(n, pool),
                   engine=replace(make(), kv_offload=off))
    assert res.kv_blocks_total == pool       # the trace is built on this pool
    return res, slice(n + 2, None)          # the second turns


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_gpu_misses_cpu_hits_at_the_boundary(engine):
    off = kvtiers.Offload(("cpu",), CPU_4)
    for n, hits in ((4, [P] * 4), (5, [0] + [P] * 4)):
        alone, second = _run(engine, n, None)
        tiered, _ = _run(engine, n, off)
        assert alone.prefix_hit_tokens[second].tolist() == [0] * n
        assert tiered.prefix_hit_tokens[second].tolist() == hits
        tiers = tiered.summary()["kv_tiers"]
        assert tiers["capacity_blocks"] == {"cpu": 256}
        assert tiers["hit_tokens"] == {"gpu": 0, "cpu": 4 * P}
        assert tiers["loads"] == 4
        assert tiers["load_s"] == pytest.approx(4 * 64 * BLOCK_BYTES / LINK, rel=1e-12)
        assert tiers["hit_rate"]["cpu"] == pytest.approx(
            4 * P / tiered.requests.input_tokens.sum())
        # the hits' TTFT is well below a recompute of 1039 tokens, and pays the load
        assert tiered.ttft_s[second][1:].max() < 0.5 * alone.ttft_s[second].min()
        assert (tiered.ttft_s[second] > 0).all()


def _compute(engine: str, seqs: int) -> float:
    """GPU seconds of a step of ``seqs`` second turns' 15 new tokens at context 1039."""
    m = load.model("llama-3-8b")
    batch = Batch(np.arange(seqs), np.full(seqs, 15), np.full(seqs, P + 1 + GROWTH), True,
                  False, 0)
    pricer = StepPricer(m, load.hardware("h100-sxm", engine), Parallelism(),
                        Workload.for_model(m), ENGINES[engine][0]())
    return float(pricer.gpu([batch])[0][0])


def _second_steps(res, second) -> np.ndarray:
    """GPU seconds of the steps from the second turns' first, two of them."""
    first = int(np.flatnonzero(res.steps.start_s == res.scheduled_s[second].min())[0])
    return res.steps.gpu_s[first:first + 2]


def test_each_engines_load_rule_on_the_second_turns_step():
    """D: one chain's load, 64 x 2,097,152 B / 64 GB/s = 2.097152 ms.

    - vLLM (async, its OffloadingConnector): nothing runs when the four arrive, so the
      first is loaded before its step (D + its compute C1) and the other three load while
      that step runs, out of it: the step lasts D + max(C1, 3 D); they run the next step
      (C3) with nothing to load.
    - SGLang (layered): all four in one step, max(C4, 4 D) + min(C4, 4 D) / 32.
    - Either engine with --kv-offload-overlap serial: C4 + 4 D in one step.
    """
    off = kvtiers.Offload(("cpu",), CPU_4)
    d = 64 * BLOCK_BYTES / LINK
    res, second = _run("vllm", 4, off)
    c1, c3 = _compute("vllm", 1), _compute("vllm", 3)
    assert _second_steps(res, second) == pytest.approx([d + max(c1, 3 * d), c3], rel=1e-9)
    assert res.ttft_s[second][0] < res.ttft_s[second][1]        # the rest waited a step
    res, second = _run("sglang", 4, off)
    c4 = _compute("sglang", 4)
    assert _second_steps(res, second)[0] == pytest.approx(
        max(c4, 4 * d) + min(c4, 4 * d) / 32, rel=1e-9)
    for engine in ("vllm", "sglang"):
        res, second = _run(engine, 4, replace(off, overlap="serial"))
        assert _second_steps(res, second)[0] == pytest.approx(
            _compute(engine, 4) + 4 * d, rel=1e-9), engine


def test_step_seconds_hand_values():
    gpu = np.array([10.0, 10.0, 3.0, 5.0, 3.0, 10.0])
    loads = [(0.0, 0.0, 0.0), (4.0, 0.0, 0.0), (0.0, 8.0, 0.0), (1.0, 2.0, 0.0),
             (0.0, 0.0, 5.0), (1.0, 0.0, 5.0)]
    # serial adds; layered: max(C, D) + min(C, D) / L with L = 4; apart: at least D
    assert kvtiers.step_seconds(gpu, loads, 4).tolist() == \
        [10.0, 14.0, 8.75, 1.0 + 5.5, 5.0, 11.0]


def _tiers(cap: int, policy: str = "write_through") -> kvtiers.Tiers:
    return kvtiers.Tiers(kvtiers.Offload(("cpu",), write_policy=policy, blocks=(cap,),
                                         link_bytes_per_s=1.0, block_bytes=1.0))


def test_lru_evicts_the_oldest_chains_tail_first():
    t = _tiers(100)
    for p, n in ((0, 40), (1, 40)):
        t.cached(("p", p), n)
    t.load(("p", 0), 40, 0, 16, True)       # a hit touches chain 0: chain 1 is now oldest
    t.cached(("p", 2), 50)                  # 30 blocks over: chain 1 keeps its first 10
    assert t.hits(("p", 1), 40, 0) == [10]
    assert t.hits(("p", 0), 40, 0) == [40]
    assert t.hits(("p", 0), 40, 25) == [15]     # past the GPU's 25 blocks
    assert t.used == [100]
    t.cached(("r", 7), 10)                  # a preempted request's chain is not stored
    assert t.used == [100] and t.hit_tokens == [640]


def test_write_back_stores_only_on_eviction():
    t = _tiers(100, "write_back")
    t.cached(("p", 0), 40)
    assert t.hits(("p", 0), 40, 0) == [0]
    t.evicted(("p", 0), 40)
    assert t.hits(("p", 0), 40, 0) == [40]
    off = kvtiers.Offload(("cpu",), CPU_4, write_policy="write_back")
    res, second = _run("vllm", 4, off)      # the flushers evict every chain: stored then
    assert res.prefix_hit_tokens[second].tolist() == [P] * 4


def test_offload_that_never_hits_changes_nothing():
    """No shared prefix: the tiers store nothing and every time is the GPU-only one."""
    n = 12
    plain = Requests(np.arange(n) * 0.05, np.full(n, 700, np.int64), np.full(n, 20, np.int64),
                     np.full(n, -1, np.int64), np.zeros(n, np.int64))
    m, hw = load.model("llama-3-8b"), load.hardware("h100-sxm")
    a = simulate(m, hw, plain)
    b = simulate(m, hw, plain, engine=EngineConfig(kv_offload=kvtiers.Offload()))
    assert np.array_equal(a.token_s, b.token_s)
    assert b.summary()["kv_tiers"]["loads"] == 0


def _csv(tmp_path, n: int) -> str:
    path = tmp_path / "turns.csv"
    lines = ["arrival_s,input_tokens,output_tokens,session_id,turn"]
    lines += [f"{a},{i},{o},{s},{t if s else ''}" for a, i, o, s, t in _rows(n, 341)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


BASE = ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm", "--gpu-memory-utilization", "0.23",
        "--no-band", "--no-progress"]


def test_cli_table_and_json(tmp_path):
    gb = f"{CPU_4 / 1e9:.9f}"
    trace = _csv(tmp_path, 4)
    out = runner.invoke(app, [*BASE, "--trace", trace, "--kv-offload", "cpu",
                              "--cpu-kv-gb", gb])
    assert out.exit_code == 0, out.output
    assert "num_cpu_blocks\":256" in out.output
    assert "cpu  hit        4,096 tokens" in out.output
    js = runner.invoke(app, [*BASE, "--trace", trace, "--kv-offload", "cpu", "--cpu-kv-gb",
                             gb, "--format", "json"])
    tiers = json.loads(js.output)["kv_tiers"]
    assert tiers["hit_tokens"] == {"gpu": 0, "cpu": 4096} and tiers["loads"] == 4
    off = runner.invoke(app, [*BASE, "--trace", trace, "--format", "json"])
    assert "kv_tiers" not in json.loads(off.output)


@pytest.mark.parametrize(("args", "says"), [
    (["--kv-offload", "gpu"], "--kv-offload: expected cpu or cpu,ssd"),
    (["--kv-offload", "cpu,ssd"], "--ssd-kv-gb: --kv-offload cpu,ssd needs"),
    (["--cpu-kv-gb", "4"], "--cpu-kv-gb: applies with --kv-offload"),
    (["--kv-offload", "cpu", "--cpu-kv-gb", "-1"], "--cpu-kv-gb: expected a positive"),
    (["--kv-offload", "cpu", "--kv-offload-write-policy", "lazy"],
     "--kv-offload-write-policy: expected one of"),
    (["--kv-offload", "cpu", "--kv-offload-overlap", "eager"],
     "--kv-offload-overlap: expected one of"),
    (["--kv-offload", "cpu", "--cpu-kv-gb", "9", "--engine", "sglang", "--kv-offload-overlap",
      "async"], "--kv-offload-overlap async: vLLM's OffloadingConnector's rule"),
    (["--kv-offload", "cpu", "--cpu-kv-gb", "9", "--engine", "trtllm"],
     "modelled for --engine vllm and sglang"),
    (["--kv-offload", "cpu", "--cpu-kv-gb", "9", "--no-prefix-caching"],
     "turn prefix caching on"),
])
def test_cli_bad_options_one_line(args, says):
    out = runner.invoke(app, [*BASE, "--num-requests", "4", "--rate", "1", *args])
    assert out.exit_code != 0
    assert says in out.output and "Traceback" not in out.output
    assert len(out.output.strip().splitlines()) == 1, out.output


def test_cli_device_without_host_block():
    out = runner.invoke(app, ["simulate", "-m", "llama-3-8b", "-H", "gaudi3", "--num-requests",
                              "2", "--rate", "1", "--no-band", "--no-progress",
                              "--max-model-len", "2048", "--kv-offload", "cpu"])
    assert out.exit_code != 0
    assert "hardware gaudi3 has no host: block" in out.output


def test_cli_warns_of_an_assumed_or_oversized_cpu_tier():
    args = [*BASE, "--num-requests", "2", "--rate", "1", "--kv-offload", "cpu"]
    out = runner.invoke(app, args)
    assert out.exit_code == 0 and "the CPU tier is 2 x the GPU's KV pool" in out.output
    big = runner.invoke(app, [*args, "--cpu-kv-gb", "300"])
    assert "more than h100-sxm's reference host memory per GPU (250 GB" in big.output
    fits = runner.invoke(app, [*args, "--cpu-kv-gb", "100"])
    assert "warning: --cpu-kv-gb" not in fits.output and "warning: --kv-off" not in fits.output


OFFLOAD_CASES = {"vllm-async": ("vllm", "async", "write_through"),
                 "vllm-serial-back": ("vllm", "serial", "write_back"),
                 "sglang-layered": ("sglang", "layered", "write_through")}


@pytest.mark.parametrize("case", sorted(OFFLOAD_CASES))
@pytest.mark.parametrize("seed", [1, 2])
def test_protocol_invariants_with_tiers(case, seed):
    """Seeded bursts of requests sharing prefixes on a pool small enough to evict them
    (and preempt): every batch non-empty, its context's blocks held, one token a step at
    most; at the end every output emitted, no load left waiting, the pool whole, each tier
    within its capacity, and some prefix served from the CPU tier."""
    name, overlap, policy = OFFLOAD_CASES[case]
    rng = np.random.default_rng(seed)
    n = 60
    prompt, output = rng.integers(80, 600, n), rng.integers(1, 60, n)
    prefix = np.where(rng.random(n) < 0.7, rng.integers(0, 6, n), -1)
    prefix_tokens = np.where(prefix >= 0, np.minimum(prompt - 1, 64), 0)
    cap = 192 // engine_config(name).block_size       # three 64-token prefixes
    off = kvtiers.Offload(("cpu",), write_policy=policy, overlap=overlap, blocks=(cap,),
                          link_bytes_per_s=LINK, block_bytes=BLOCK_BYTES, layers=32)
    engine = replace(engine_config(name), kv_offload=off)
    blocks = 2560 // engine.block_size
    engine = engine.resolved(blocks, int((prompt + output).max()))
    state = engine.state(prompt, output, prefix, prefix_tokens, blocks)
    state.waiting.extend(range(n))
    for _ in range(20_000):
        batch = state.schedule()
        if batch is None:
            state.settle()
            if not (state.running or state.waiting):
                break
            continue
        assert len(batch.ids) and (batch.new >= 1).all()
        held = (state.own[batch.ids] + state.shared[batch.ids]) * state.engine.block_size
        assert (held >= batch.context).all()
        assert all(x >= 0 for x in batch.loads)
        before = state.emitted.copy()
        state.commit(batch)
        assert set((state.emitted - before).tolist()) <= {0, 1}
    state.settle()
    tiers = state.pool.tiers
    assert (state.emitted == state.output).all() and not state.waiting
    assert state.pool.free == state.pool.total and not tiers.loading
    assert tiers.used[0] == sum(tiers.held[0].values()) <= cap
    assert tiers.hit_tokens[0] > 0 and tiers.loads > 0


def test_cli_band_keeps_the_tiers_block(tmp_path):
    """The 80% band's edge runs band the latencies; the tiers' block stays the centre's."""
    args = [a for a in BASE if a != "--no-band"]
    out = runner.invoke(app, [*args, "--trace", _csv(tmp_path, 4), "--kv-offload", "cpu",
                              "--cpu-kv-gb", f"{CPU_4 / 1e9:.9f}", "--format", "json"])
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output)
    assert "mean_low" in summary["ttft_s"]
    assert summary["kv_tiers"]["hit_tokens"] == {"gpu": 0, "cpu": 4096}


def test_ssd_tier_serves_what_the_cpu_evicted():
    """Five sessions, the CPU tier of four chains and an SSD tier of eight: session 0's
    chain, evicted from the CPU, is still on the SSD (the tiers are written together). Its
    load reads 64 blocks from NVMe at 7 GB/s and moves them over the 64 GB/s link."""
    off = kvtiers.Offload(("cpu", "ssd"), CPU_4, (8 * 64 + 0.5) * BLOCK_BYTES)
    res, second = _run("vllm", 5, off)
    assert res.prefix_hit_tokens[second].tolist() == [P] * 5
    tiers = res.summary()["kv_tiers"]
    assert tiers["hit_tokens"] == {"gpu": 0, "cpu": 4 * P, "ssd": P}
    chain = 64 * BLOCK_BYTES
    assert tiers["load_s"] == pytest.approx(5 * chain / LINK + chain / 7e9, rel=1e-12)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_lookahead_prices_the_same_steps_with_tiers(engine, monkeypatch):
    """The simulator prices steps ahead on forks of the state (tiers copied with the pool):
    a run one step at a time gives every token the same time, and the same hits by tier."""
    from perfmodel.serving import engine_loop, traffic

    reqs = traffic.generate(24, rate=3.0, input_len=700, output_len=60, turns=4,
                            think_time=5.0, length_dist="uniform", seed=3)
    e = EngineConfig(gpu_memory_utilization=0.235) if engine == "vllm" else \
        engine_config("sglang", mem_fraction_static=0.205)
    e = replace(e, kv_offload=kvtiers.Offload(("cpu",), 8e9))
    m, hw = load.model("llama-3-8b"), load.hardware("h100-sxm", engine)
    ahead = simulate(m, hw, reqs, engine=e)
    monkeypatch.setattr(engine_loop, "LOOKAHEAD", 1)
    one = simulate(m, hw, reqs, engine=e)
    assert ahead.summary()["kv_tiers"]["hit_tokens"]["cpu"] > 0
    assert ahead.summary()["kv_tiers"]["hit_tokens"] == one.summary()["kv_tiers"]["hit_tokens"]
    assert np.allclose(ahead.token_s, one.token_s, rtol=0, atol=1e-12)
