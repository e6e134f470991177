"""The recurrent scan run unfused (``cost.scan_chain``): its operators and bytes for a tiny
shape by hand, and its properties against the fused kernel and the context."""

from dataclasses import replace

import numpy as np
import pytest

from perfmodel.cost.ops import Gemm
from perfmodel.cost.roofline import op_time
from perfmodel.cost.scan import LinearScan, Scan
from perfmodel.cost.scan_chain import chain, totals
from perfmodel.cost.step import Dtypes, Step, price_step
from perfmodel.specs.dtypes import dtype_code
from perfmodel.specs.errors import SpecError
from perfmodel.specs.load import HARDWARE_DIR, hardware, load_hardware, model, shipped
from perfmodel.specs.workload import Parallelism

CPU = "reports/cpu/hardware.yaml"
FP32 = dtype_code("fp32")


def _scan(batch, q_len, kv_len, heads=2, groups=1, n=2, p=2, chunk=2, delta=False,
          **kw) -> Scan:
    cls = LinearScan if delta else Scan
    return cls(batch=np.atleast_1d(batch), q_len=np.atleast_1d(q_len),
               kv_len=np.atleast_1d(kv_len), heads=heads, qk_heads=groups, d_k=n, d_v=p,
               chunk=chunk, delta=delta, act_bytes=4.0, state_bytes=4.0, dtype=FP32, **kw)


def _kernels(op: Scan) -> float:
    return sum(float(np.sum(r.count)) for r in chain(op).records)


def test_tiny_mamba2_prefill_chain_by_hand():
    """b 1, T 4 in chunks of Q 2 (c 2, L 4), H 2, G 1, N 2, P 2. fp32 elements: D = bHL = 8,
    M = DQ = 16, X = K = bLHP = bLHN = 16, Kg = bLGN = 8, S = bHNP = 8, bHc = 4.
    Read + written (a matmul's: (kn + mk + mn) x groups):
      segsum: 2 cumsums 2 x 16, sub 16 + 16, clone 32, fill 32, exp 32        160
      C B^T 2x2x2 x (bcG 2) 24; repeat 16 + 8; x decays 48; copy X 32;
      y_diag 2x2x2 x (bcH 4) 48                                                176
      to the end 24 + 16; repeat B 24; B x decay 40; copies 32 + 32; states 48  216
      zeros 8; exp 8; per chunk (x 2): mul 8 + 10, add 24; stack 32            132
      repeat C 24; exp 16; copy 32; y_off 48; x exp 40; add 48; reshape 32     240
    = 924 elements x 4 bytes = 3,696, and 3 bool masks x (4 + 4) = 24: 3,720 bytes.
    Kernels: segsum 9, then 22 once and 2 per chunk: 35; views 11 + 4 x 2 = 19.
    FLOPs: matmuls 2mnk x groups: 32 + 64 + 64 + 64 = 224; passes one per element written:
    segsum 16 + 16 + 16 + 16, x decays 16, to the end 8 + 8, B x decay 16, exp 4, loop
    2 x (8 + 8), exp 8, x exp 16, add 16: 188; 412 in all."""
    op = _scan(1, 4, 4)
    flops, nbytes, dispatches = totals(chain(op))
    assert float(nbytes) == 3720
    assert float(flops) == 412
    assert _kernels(op) == 35 and float(dispatches) == 35 + 19
    assert sum(float(np.sum(r.count)) for r in chain(op).records if isinstance(r, Gemm)) == 4


def test_tiny_mamba2_decode_step_by_hand():
    """One token after a state, b 1, H 2, G 1, N 2, P 2 (S = 8): repeat B, C 2 x (4 + 2),
    exp 2 + 2, S x decay 8 + 10, B x^T 8 + 8, S + it 8 + 16, C S (4 out, 8 + 4 in):
    12 + 4 + 18 + 16 + 24 + 16 = 90 elements = 360 bytes; 7 kernels and 8 views (the
    reference's 15 operators); FLOPs exp 2, x 8, outer 8, add 8, C S 2 x 8: 42."""
    flops, nbytes, dispatches = totals(chain(_scan(1, 1, 50)))
    assert (float(flops), float(nbytes), float(dispatches)) == (42, 360, 15)


def test_a_partial_chunk_pads_every_input():
    """T = 3 runs as L = 4 (the references pad to whole chunks): the padded call's chain is
    the whole chunk's plus a copy per input (x, the decays, B, C) and the slice back."""
    padded, whole = (totals(chain(_scan(1, t, t))) for t in (3, 4))
    # copies of X 16, D 8, B and C 8 each, read and written: (16 + 8 + 16) x 2 x 4 bytes
    assert float(padded[1] - whole[1]) == (16 + 8 + 16) * 2 * 4
    assert float(padded[2] - whole[2]) == 4 + 1


def test_groups_are_separate_calls_and_empty_groups_cost_nothing():
    """A record of three groups (a prefill, a decode, an empty one) times as the sum of the
    groups alone."""
    hw = load_hardware(CPU)
    both = _scan([2, 3, 0], [64, 1, 5], [64, 700, 5], heads=4, n=16, p=8, chunk=16)
    alone = [_scan(b, q, k, heads=4, n=16, p=8, chunk=16) for b, q, k in
             ((2, 64, 64), (3, 1, 700))]
    got = float(np.sum(op_time(both, hw, "host").time_s))
    assert np.isfinite(got)
    assert got == pytest.approx(sum(float(np.sum(op_time(a, hw, "host").time_s))
                                    for a in alone))
    assert float(np.sum(op_time(_scan(0, 8, 8), hw, "host").time_s)) == 0.0


def _devices():
    names = ["h100-sxm", "a100-80gb-sxm", "mi300x", "l4"]      # (TPUs list no fp32 rate)
    return [hardware(n) for n in names] + [load_hardware(CPU)]


@pytest.mark.parametrize("delta", [False, True])
def test_unfused_is_never_faster_than_fused_on_the_same_device(delta):
    """Every shape, device and timing: the operator chain costs at least the one kernel
    (fp32 records, the dtype both run at: the references compute in fp32)."""
    rng = np.random.default_rng(7)
    n = 400
    op = _scan(rng.integers(1, 33, n), rng.integers(1, 5000, n), rng.integers(1, 9000, n),
               heads=rng.choice([2, 8, 32, 128], n), groups=rng.choice([1, 2], n),
               n=rng.choice([16, 64, 128], n), p=rng.choice([1, 64, 128], n),
               chunk=rng.choice([1, 64, 256], n), delta=delta)
    op = replace(op, batch=op.batch[:, None], q_len=op.q_len[:, None],
                 kv_len=np.maximum(op.kv_len, op.q_len)[:, None])
    for hw in _devices():
        fused = replace(hw, efficiency=replace(hw.efficiency, scan_kernel="fused"))
        unfused = replace(hw, efficiency=replace(hw.efficiency, scan_kernel="unfused"))
        for timing in ("kernel", "stream", "host"):
            a, b = op_time(op, fused, timing).time_s, op_time(op, unfused, timing).time_s
            assert np.all(np.isfinite(b)) and np.all(b >= a), (hw.name, timing)


@pytest.mark.parametrize("delta", [False, True])
def test_decode_does_not_grow_with_the_context(delta):
    hw = load_hardware(CPU)
    times = [float(np.sum(op_time(_scan(8, 1, ctx, heads=16, n=128, p=64, chunk=64,
                                        delta=delta), hw, "host").time_s))
             for ctx in (2, 1000, 10**6)]
    assert times[0] > 0 and times == [times[0]] * 3


def test_a_decode_step_of_a_hybrid_prices_its_scan_once_whatever_the_context():
    """Qwen3-Next on the CPU file: the Gated DeltaNet scan's row of a decode step is the
    same at 1,000 and 100,000 tokens of context; it is the chain's (dearer than the kernel)."""
    m, cpu = model("qwen3-next-80b-a3b"), load_hardware(CPU)
    step = Step.uniform(np.array([4, 4]), np.array([1, 1]), np.array([1000, 100000]))

    def scan_row(hw):
        cost = price_step(m, hw, Parallelism(), step, Dtypes.of("fp32", "fp32", "fp32"), "host")
        return cost.time_s[list(cost.names).index("linear.scan")]

    unfused = scan_row(cpu)
    fused = scan_row(replace(cpu, efficiency=replace(cpu.efficiency, scan_kernel="fused")))
    assert unfused[0] == unfused[1] and unfused[0] > fused[0]


def test_the_scan_kernel_field_and_its_vendor_defaults(tmp_path):
    for name in shipped(HARDWARE_DIR):
        assert hardware(name).efficiency.scan_kernel == "fused", name
    assert load_hardware(CPU).efficiency.scan_kernel == "unfused"
    other = tmp_path / "other.yaml"
    other.write_text("version: 1\nbase: h100-sxm\nname: other\nvendor: other\n")
    assert load_hardware(other).efficiency.scan_kernel == "unfused"
    said = tmp_path / "said.yaml"
    said.write_text("version: 1\nbase: h100-sxm\nname: said\nefficiency:\n"
                    "  scan_kernel: unfused\n  source: test\n")
    assert load_hardware(said).efficiency.scan_kernel == "unfused"
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nbase: h100-sxm\nname: bad\nefficiency:\n"
                   "  scan_kernel: fast\n  source: test\n")
    with pytest.raises(SpecError) as info:
        load_hardware(bad)
    assert "efficiency.scan_kernel: expected one of fused, unfused" in str(info.value)
