"""How kernels compose into a CUDA-graph step (``specs.composition``, timing ``graph``):
hand-derived goldens, the file block's checks, the fit's recovery of a known overlap, and
the exact decode sum of a composed step against every step priced alone."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost.ops import Gemm
from perfmodel.cost.roofline import op_time
from perfmodel.cost.step import Dtypes, Step, price_step
from perfmodel.schedules.static import phase_timing
from perfmodel.specs.composition import Composition
from perfmodel.specs.errors import SpecError
from tests.test_decode_sum import _check

ROOT = Path(__file__).resolve().parents[1]


def _with(overlap: float, name: str = "h100-sxm") -> pm.Hardware:
    return replace(pm.hardware(name), composition=Composition(overlap, "test"))


def _gemv() -> Gemm:
    return Gemm(m=np.array([1]), n=np.array([4096]), k=np.array([4096]))


def test_graph_timing_pays_the_exposed_share_of_the_fixed_cost() -> None:
    """A GEMV inside a graph step: its isolated time less overlap x its fixed cost (2 us
    a kernel, two kernels with its split-K reduction: overlap 0.25 hides 0.5 us of each);
    ``kernel`` (an isolated kernel) is unchanged."""
    hw = _with(0.25)
    hw = replace(hw, efficiency=replace(hw.efficiency, kernel_latency_s=2e-6))
    alone, inside = (op_time(_gemv(), hw, t) for t in ("kernel", "graph"))
    kernels = float(alone.fixed_s[0]) / 2e-6
    assert kernels in (1.0, 2.0)
    assert float(alone.time_s[0] - inside.time_s[0]) == pytest.approx(0.5e-6 * kernels,
                                                                        rel=1e-9)
    assert float(inside.fixed_s[0]) == pytest.approx(1.5e-6 * kernels, rel=1e-12)
    none = op_time(_gemv(), replace(hw, composition=Composition()), "graph")
    assert float(none.time_s[0]) == pytest.approx(float(alone.time_s[0]), rel=1e-12)


def test_only_graph_replayed_decode_is_composed() -> None:
    """``phase_timing``: decode under --cuda-graphs is timed ``graph``; prefill and eager
    decode keep the device's own timing."""
    hw = pm.hardware("h100-sxm")
    assert int(phase_timing(hw, "decode", True)) == 3
    assert int(phase_timing(hw, "decode", False)) == 1
    assert int(phase_timing(hw, "prefill", True)) == 1


def test_a_step_moves_by_the_hidden_fixed_cost() -> None:
    """A batch-4 decode step timed ``graph``: with overlap 0.5 it is shorter by half its
    kernels' fixed costs (``fixed_s`` x count at overlap 0); an estimate's prefill (not a
    graph) does not move."""
    model = pm.model("llama-3-8b")
    step = Step.uniform(4, 1, np.array([700]))
    d = Dtypes.of("bf16", "bf16", "bf16", 0).take(np.zeros(1, dtype=int))
    base, half = (price_step(model, hw, pm.Parallelism(), step, d, "graph")
                  for hw in (_with(0.0), _with(0.5)))
    fixed = float(np.sum(base.fixed_s * base.count))
    assert float(base.time[0] - half.time[0]) == pytest.approx(fixed / 2, rel=1e-9)
    wl = pm.Workload(batch=1, prompt_len=128, gen_len=2, cuda_graphs=True)
    a, b = (pm.estimate(hw, model, wl) for hw in (_with(0.0), _with(0.5)))
    assert b.prefill.time_s == pytest.approx(a.prefill.time_s, rel=1e-12)
    assert b.decode.time_s < a.decode.time_s


@pytest.mark.parametrize(("model", "hw", "batch", "prompt", "gen"), [
    ("llama-3-8b", "h100-sxm", 1, 200, 200),
    ("deepseek-v2-lite", "h200-sxm", 2, 900, 160),
    ("gemma-2-9b", "a100-80gb-sxm", 1, 4030, 140),
])
def test_composed_decode_sum_is_exact(model, hw, batch, prompt, gen) -> None:
    """The exact decode sum of a graph-replayed (composed) step against every step priced
    alone, at a large overlap so that a composition the sum missed would show."""
    _check(pm.model(model), _with(0.6, hw),
           pm.Workload(batch=batch, prompt_len=prompt, gen_len=gen, cuda_graphs=True),
           pm.Parallelism())


def _yaml(tmp_path: Path, block: str) -> Path:
    text = (ROOT / "perfmodel" / "hardware" / "h100-sxm.yaml").read_text()
    text = text.split("\ncomposition:")[0] + "\n" + block
    path = tmp_path / "hw.yaml"
    path.write_text(text)
    return path


def test_block_is_read_and_checked(tmp_path: Path) -> None:
    good = _yaml(tmp_path, 'composition:\n  graph_overlap: 0.2\n  source: "a fit"\n')
    assert pm.load_hardware(good).composition == Composition(0.2, "a fit", 0.2)
    for block, field in (('composition:\n  graph_overlap: 0.95\n  source: "x"\n',
                          "graph_overlap"),
                         ('composition:\n  graph_overlap: -0.1\n  source: "x"\n',
                          "graph_overlap"),
                         ("composition:\n  graph_overlap: 0.1\n", "source"),
                         ('composition:\n  graph_overlap: 0.3\n  graph_overlap_max: 0.2\n'
                          '  source: "x"\n', "graph_overlap_max"),
                         ('composition:\n  graph_overlap: 0.1\n  source: "x"\n  ovrlap: 1\n',
                          "composition: 1 unknown field")):   # the file's key is not quoted
        with pytest.raises(SpecError, match=field):
            pm.load_hardware(_yaml(tmp_path, block))


def test_shipped_files_carry_a_sourced_overlap() -> None:
    """Measured devices say so; the rest of NVIDIA's carry the family rule; others none."""
    assert "whole-step fit" in pm.hardware("h200-sxm").composition.source
    assert "family rule" in pm.hardware("b200").composition.source
    assert pm.hardware("mi300x").composition == Composition()


def test_fit_recovers_a_known_overlap() -> None:
    """Synthetic steps made with overlap 0.3 (no noise): the grid fit finds it, and leaving
    one out predicts it exactly."""
    sys.path.insert(0, str(ROOT / "reports" / "composition"))
    import fit

    rng = np.random.default_rng(0)
    rows = [{"shape": str(i), "body_s": b, "fixed_s": f, "measured_s": b + 0.7 * f}
            for i, (b, f) in enumerate(rng.uniform(1e-3, 5e-3, (8, 2)))]
    assert fit.fit(rows) == pytest.approx(0.3, abs=1e-3)
    assert np.max(np.abs(fit.leave_one_out(rows))) < 2e-3


def test_band_term_spans_every_overlap_the_data_allow() -> None:
    """Overlap 0.2 of at most 0.6 on 1 s of graph fixed cost: up to 0.4 / 0.8 = 0.5 s
    faster (all of 0.6 hidden) and 0.2 / 0.8 = 0.25 s slower (none hidden); the band of a
    step with no other class is exactly that, around an unmoved centre."""
    from perfmodel.cost.band import band
    from perfmodel.specs.uncertainty import Uncertainty

    comp = Composition(0.2, "test", 0.6)
    down, up = comp.edges(np.array([1.0]))
    assert float(down[0]) == pytest.approx(0.5) and float(up[0]) == pytest.approx(0.25)
    per = np.zeros((len(pm.specs.uncertainty.ERROR_CLASSES), 1))
    per[0] = 3.0
    for unc in (Uncertainty("test", {}, {}), Uncertainty("test", {"gemv": 0.0}, {"gemv": 0.0})):
        lo, hi = band(per, unc, composed=(down, up))
        assert float(lo[0]) == pytest.approx(2.5) and float(hi[0]) == pytest.approx(3.25)
    lo, hi = band(per, Uncertainty("test", {}, {}))
    assert (float(lo[0]), float(hi[0])) == (3.0, 3.0)     # no term, no class: no band


def test_estimate_band_widens_only_graph_decode() -> None:
    """The composition term moves the band of a graph-replayed decode only."""
    model, hw = pm.model("llama-3-8b"), pm.hardware("h200-sxm")
    none = replace(hw, composition=Composition(hw.composition.graph_overlap, "t",
                                               hw.composition.graph_overlap))
    for graphs, wider in ((True, True), (False, False)):
        wl = pm.Workload(batch=1, prompt_len=128, gen_len=64, cuda_graphs=graphs)
        a, b = (pm.estimate(h, model, wl).band["tpot_s"] for h in (none, hw))
        assert (float(b[0]) < float(a[0])) is wider
