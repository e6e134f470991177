"""The serving scheduler's pieces on their own: the paged KV pool and its prefix cache
(``serving.kvpool``), one engine step's schedule (``engines.vllm.VLLMState``) traced by
hand against vLLM v1's rules (``vllm/v1/core/sched/scheduler.py``), and the checks on a
request stream, an engine's settings and what the simulator is asked to serve."""

from __future__ import annotations

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.serving.engines.state import EngineState
from perfmodel.serving.engines.vllm import EngineConfig, VLLMState
from perfmodel.serving.kvpool import KVPool
from perfmodel.serving.pricing import kv_pool
from perfmodel.serving.requests import Requests
from perfmodel.serving.simulate import simulate
from perfmodel.specs.errors import SpecError
from perfmodel.specs.workload import Parallelism, Workload

LLAMA = pm.model("llama-3-8b")
QWEN = pm.model("qwen3-8b")
H100 = pm.hardware("h100-sxm")


def _check_pool(pool: KVPool, held: int) -> None:
    """The free queue holds exactly the free blocks, in non-empty runs; the rest are held."""
    assert all(run[1] > 0 for run in pool.runs)
    assert sum(run[1] for run in pool.runs) == pool.free
    assert 0 <= pool.free <= pool.total
    assert pool.used == pool.total - pool.free == held


# KV pool ---------------------------------------------------------------------------------

def test_allocate_and_release_account_for_every_block():
    pool = KVPool(10)
    _check_pool(pool, 0)
    assert pool.allocate(3)
    _check_pool(pool, 3)
    assert not pool.allocate(8)            # all or nothing
    _check_pool(pool, 3)
    assert pool.allocate(7)
    _check_pool(pool, 10)
    assert not pool.allocate(1)
    pool.release(3, ("r", 1))
    _check_pool(pool, 7)
    assert pool.cached(("r", 1)) == 3
    pool.release(0, ("r", 2))              # nothing to return: no empty run
    _check_pool(pool, 7)
    assert pool.cached(("r", 2)) == 0
    pool.release(4)
    pool.release(3)                        # uncached runs at the tail merge
    assert pool.runs[-1] == [None, 7]
    _check_pool(pool, 0)


def test_lru_evicts_the_oldest_released_run_first_and_a_chain_keeps_its_head():
    pool = KVPool(10)
    assert pool.allocate(10)
    pool.release(2, ("r", 1))
    pool.release(3, ("r", 2))
    pool.release(5)
    assert pool.allocate(1)                # evicts the tail block of r1's chain
    assert (pool.cached(("r", 1)), pool.cached(("r", 2))) == (1, 3)
    assert pool.allocate(1)
    assert (pool.cached(("r", 1)), pool.cached(("r", 2))) == (0, 3)
    assert pool.allocate(2)                # r2's chain, tail first: its head block stays
    assert pool.cached(("r", 2)) == 1
    pool.release(1, ("r", 1))              # released now: the newest
    assert pool.allocate(1)
    assert (pool.cached(("r", 1)), pool.cached(("r", 2))) == (1, 0)
    _check_pool(pool, 10 - pool.free)
    assert pool.free == 6


def test_take_cached_moves_blocks_into_use_and_forget_uncaches_them():
    pool = KVPool(8)
    assert pool.allocate(8)
    pool.release(5, ("r", 3))
    pool.take_cached(("r", 3), 2)
    _check_pool(pool, 5)
    assert pool.cached(("r", 3)) == 3
    pool.forget(("r", 3))
    assert pool.cached(("r", 3)) == 0
    _check_pool(pool, 5)                   # still free, just no longer a hit
    with pytest.raises(ValueError):
        pool.take_cached(("r", 3), 1)
    copy = pool.copy()
    assert copy.allocate(3)
    assert (pool.free, copy.free) == (3, 0)      # a copy is independent


def test_shared_prefix_publish_reference_dereference():
    pool = KVPool(12)
    assert pool.allocate(4)                # request A computes the prefix's 4 blocks
    assert pool.publish(0, 4)
    assert not pool.publish(0, 4)          # already A's copy
    assert pool.prefix_blocks(0) == 4
    pool.reference(0, 4)                   # B shares it: no new blocks
    assert pool.active[0] == [4, 2]
    _check_pool(pool, 4)
    pool.dereference(0)
    _check_pool(pool, 4)
    pool.dereference(0)                    # last user gone: cached in the free queue
    assert 0 not in pool.active
    assert pool.cached(("p", 0)) == pool.prefix_blocks(0) == 4
    _check_pool(pool, 0)
    pool.reference(0, 3)                   # C hits 3 of them: out of the queue, into use
    assert pool.active[0] == [3, 1]
    assert pool.cached(("p", 0)) == 0      # the unused tail is no longer the chain
    _check_pool(pool, 3)
    pool.dereference(0)
    _check_pool(pool, 0)
    assert pool.cached(("p", 0)) == 3


def test_random_pool_operations_keep_the_books():
    rng = np.random.default_rng(11)
    for _ in range(20):
        pool = KVPool(int(rng.integers(1, 40)))
        held, refs, size = 0, {}, {}       # blocks in use; prefix -> its users, its blocks
        for _ in range(60):
            op = rng.integers(0, 5)
            if op == 0:
                k, free = int(rng.integers(0, pool.total + 2)), pool.free
                ok = pool.allocate(k)
                assert ok == (k <= free)
                held += k if ok else 0
            elif op == 1 and held - sum(size.values()):
                k = int(rng.integers(1, held - sum(size.values()) + 1))
                pool.release(k, None if rng.random() < 0.5 else ("r", int(rng.integers(3))))
                held -= k
            elif op == 2:
                key = ("r", int(rng.integers(3)))
                if pool.cached(key):
                    k = int(rng.integers(1, pool.cached(key) + 1))
                    pool.take_cached(key, k)
                    held += k
            elif op == 3:
                p = int(rng.integers(2))
                if p in refs:
                    pool.reference(p, size[p])
                    refs[p] += 1
                elif pool.cached(("p", p)):
                    size[p] = int(rng.integers(1, pool.cached(("p", p)) + 1))
                    pool.reference(p, size[p])
                    refs[p], held = 1, held + size[p]
                elif pool.allocate(2):
                    assert pool.publish(p, 2)
                    refs[p], size[p], held = 1, 2, held + 2
            elif refs:
                p = int(rng.choice(sorted(refs)))
                pool.dereference(p)
                refs[p] -= 1
                if not refs[p]:
                    del refs[p]
                    held -= size.pop(p)
                    assert pool.cached(("p", p)) >= 1
            _check_pool(pool, held)
            assert {p: v[1] for p, v in pool.active.items()} == refs
            assert {p: v[0] for p, v in pool.active.items()} == size


# one step's schedule ----------------------------------------------------------------------

def _state(engine: EngineConfig, prompt: list, output: list, blocks: int = 10_000,
           prefix: list | None = None, prefix_tokens: list | None = None) -> EngineState:
    n = len(prompt)
    st = VLLMState.new(engine, np.array(prompt), np.array(output),
                         np.array(prefix if prefix else [-1] * n),
                         np.array(prefix_tokens if prefix_tokens else [0] * n), blocks)
    st.waiting.extend(range(n))
    return st


def _step(st: EngineState) -> tuple[list, list, list]:
    batch = st.schedule()
    out = (batch.ids.tolist(), batch.new.tolist(), batch.context.tolist())
    st.commit(batch)
    return out


def test_chunked_prefill_fills_the_budget_running_first():
    st = _state(EngineConfig(max_num_batched_tokens=256), [300, 100], [2, 2])
    batch = st.schedule()
    assert (batch.ids.tolist(), batch.new.tolist(), batch.prefill, batch.open) == \
        ([0], [256], True, False)          # the budget is spent: r1 waits
    st.commit(batch)
    assert st.emitted.tolist() == [0, 0] and st.own.tolist() == [16, 0]
    assert _step(st) == ([0, 1], [44, 100], [300, 100])       # r0's last chunk, then r1
    assert st.emitted.tolist() == [1, 1]
    assert st.pool.used == 19 + 7
    batch = st.schedule()
    assert (batch.ids.tolist(), batch.new.tolist(), batch.prefill) == ([0, 1], [1, 1], False)
    st.commit(batch)
    assert st.running == [] and st.pool.used == 0 and st.emitted.tolist() == [2, 2]
    assert st.schedule() is None


def test_seats_limit_admission_in_arrival_order():
    st = _state(EngineConfig(max_num_seqs=2), [10] * 5, [3] * 5)
    assert _step(st)[0] == [0, 1]
    assert _step(st)[0] == [0, 1]
    assert _step(st)[0] == [0, 1]          # r0 and r1 finish here
    assert _step(st)[0] == [2, 3]


def test_preemption_takes_the_last_admitted_and_its_cached_head_is_hit_again():
    """7 blocks of 16; three 32-token prompts take 2 each. Their first decode needs a
    third block each: r0 gets the last free one, r1 preempts r2 (the last admitted), whose
    2 blocks are freed tail first; r1 takes one, so r2's head block stays cached."""
    st = _state(EngineConfig(), [32, 32, 32], [10, 10, 10], blocks=7)
    assert _step(st) == ([0, 1, 2], [32, 32, 32], [32, 32, 32])
    batch = st.schedule()
    assert (batch.ids.tolist(), batch.new.tolist(), batch.preempted, batch.open) == \
        ([0, 1], [1, 1], 1, False)
    st.commit(batch)
    assert list(st.waiting) == [2] and st.preemptions.tolist() == [0, 0, 1]
    assert st.computed[2] == 0 and st.pool.cached(("r", 2)) == 1 and st.pool.free == 1
    for _ in range(8):                     # r2 (33 tokens: 2 fresh blocks + 1 hit) waits
        assert _step(st)[0] == [0, 1]
    assert st.running == [] and st.pool.free == 7
    # 33 tokens, 16 of them its own cached block: 17 recomputed
    assert _step(st) == ([2], [17], [33])
    assert st.emitted[2] == 2 and st.pool.used == 3
    assert st.hit_tokens[2] == 0           # hits count at first admission only


def test_waiting_queue_stops_at_the_first_request_whose_blocks_do_not_fit():
    st = _state(EngineConfig(), [80, 16], [2, 2], blocks=4)   # r0 needs 5 blocks
    assert st.schedule() is None
    assert list(st.waiting) == [0, 1] and st.pool.free == 4


def test_without_chunked_prefill_a_prompt_runs_whole_or_waits():
    st = _state(EngineConfig(max_num_batched_tokens=256, chunked_prefill=False),
                [200, 100], [2, 2])
    assert _step(st) == ([0], [200], [200])
    assert _step(st) == ([0, 1], [1, 100], [201, 100])


def test_without_chunked_prefill_a_prompt_too_big_for_the_budget_left_is_skipped():
    st = _state(EngineConfig(max_num_batched_tokens=256, chunked_prefill=False),
                [200, 100, 10], [2, 2, 2])
    assert _step(st)[0] == [0, 2]


def test_shared_prefix_hit_is_full_blocks_one_token_short_of_the_prompt():
    """A 48-token prompt that is all prefix: the second request may reuse 2 blocks, not 3
    (vLLM recomputes the last prompt token to get its logits)."""
    st = _state(EngineConfig(), [48, 48], [3, 3], prefix=[0, 0], prefix_tokens=[48, 48])
    st.waiting.pop()                       # r1 arrives after r0's first step
    assert _step(st) == ([0], [48], [48])
    assert st.shared[0] == 3 and st.own[0] == 0          # published as the shared chain
    st.waiting.append(1)
    assert _step(st) == ([0, 1], [1, 16], [49, 48])
    assert st.hit_tokens.tolist() == [0, 32]
    assert st.pool.active[0] == [3, 2]
    assert st.pool.used == 3 + 1 + 1       # the prefix, r0's 4th block, r1's 3rd


def test_static_batch_reserves_final_kv_and_keeps_finished_rows_as_padding():
    st = _state(EngineConfig(scheduler="static", max_num_seqs=2), [32, 32, 32], [2, 4, 1])
    assert _step(st) == ([0, 1], [32, 32], [32, 32])
    assert st.pool.used == 3 + 3           # ceil(34/16) + ceil(36/16): final lengths
    assert _step(st) == ([0, 1], [1, 1], [33, 33])       # r0 finishes, stays as padding
    assert st.padded.tolist() == [True, False, False] and list(st.waiting) == [2]
    assert _step(st) == ([0, 1], [1, 1], [34, 34])       # no admission while it runs
    assert st.emitted.tolist() == [2, 3, 0]
    assert _step(st) == ([0, 1], [1, 1], [35, 35])
    assert st.running == [] and st.pool.used == 0
    assert _step(st) == ([2], [32], [32])
    assert st.emitted.tolist() == [2, 4, 1]


# bad input -------------------------------------------------------------------------------

def _one_line(exc: pytest.ExceptionInfo, *words: str) -> None:
    text = str(exc.value)
    assert "\n" not in text
    for word in words:
        assert word in text


@pytest.mark.parametrize("args, field", [
    (([1.0, 0.5], [10, 10], [5, 5]), "arrival_s"),
    (([0.0, 1.0], [10, 0], [5, 5]), "input_tokens"),
    (([0.0, 1.0], [10, 10], [5, 0]), "output_tokens"),
    (([0.0, 1.0], [10, 10], [5]), "output_tokens"),
    (([], [], []), "no requests"),
    (([0.0], [10], [5], [0], [11]), "prefix_tokens"),
])
def test_bad_requests_are_refused(args, field):
    with pytest.raises(SpecError) as exc:
        Requests.of(*args)
    _one_line(exc, "requests:", field)


def test_a_closed_loop_may_list_think_times_in_any_order():
    assert len(Requests.of([1.0, 0.5], [10, 10], [5, 5], closed_loop=2)) == 2


@pytest.mark.parametrize("kwargs, flag", [
    ({"max_num_seqs": 0}, "--max-num-seqs"),
    ({"max_num_batched_tokens": -5}, "--max-num-batched-tokens"),
    ({"block_size": 0}, "--block-size"),
    ({"gpu_memory_utilization": 0.0}, "--gpu-memory-utilization"),
    ({"gpu_memory_utilization": 1.2}, "--gpu-memory-utilization"),
    ({"scheduler": "dynamic"}, "--scheduler"),
    ({"max_model_len": -1}, "--max-model-len"),
])
def test_bad_engine_settings_are_refused(kwargs, flag):
    with pytest.raises(SpecError) as exc:
        EngineConfig(**kwargs)
    _one_line(exc, flag)


def test_engine_flags_read_as_vllm_serve_flags():
    flags = EngineConfig(max_num_seqs=4, chunked_prefill=False, cuda_graphs=False,
                         max_model_len=2048).flags()
    assert flags == ("--max-num-seqs 4 --max-num-batched-tokens 8192 "
                     "--gpu-memory-utilization 0.9 --block-size 16 "
                     "--no-enable-chunked-prefill --enable-prefix-caching --enforce-eager "
                     "--max-model-len 2048")


# the simulator's refusals ----------------------------------------------------------------

def test_a_request_longer_than_the_context_is_refused():
    with pytest.raises(SpecError) as exc:
        simulate(LLAMA, H100, Requests.of([0.0], [8000], [500]))
    assert "\n" not in str(exc.value) and "8500" in str(exc.value)
    assert "--max-model-len" in str(exc.value) and "8192" in str(exc.value)
    with pytest.raises(SpecError, match="--max-model-len"):
        simulate(LLAMA, H100, Requests.of([0.0], [1000], [100]),
                 engine=EngineConfig(max_model_len=1024))


def test_a_model_that_does_not_fit_is_refused():
    big, l4 = pm.model("llama-3.1-405b"), pm.hardware("l4")
    with pytest.raises(SpecError) as exc:
        simulate(big, l4, Requests.of([0.0], [100], [10]))
    text = str(exc.value)
    assert "\n" not in text and "does not fit" in text and "--gpu-memory-utilization" in text


def test_a_request_bigger_than_the_kv_pool_is_refused():
    # the activations and weights at 0.9, then the share that leaves 10 blocks of 16
    w = Workload.for_model(QWEN)
    p = kv_pool(QWEN, H100, Parallelism(), w, EngineConfig())
    util = (H100.runtime_reserved_bytes + p.weights_bytes + p.activation_bytes
            + 10.5 * p.bytes_per_block) / H100.memory_bytes
    engine = EngineConfig(gpu_memory_utilization=util)
    assert kv_pool(QWEN, H100, Parallelism(), w, engine).blocks == 10
    with pytest.raises(SpecError) as exc:
        simulate(QWEN, H100, Requests.of([0.0], [150], [20]), engine=engine)
    assert "\n" not in str(exc.value) and "10" in str(exc.value) and "KV" in str(exc.value)
    simulate(QWEN, H100, Requests.of([0.0], [140], [20]), engine=engine)   # 10 blocks: fits
