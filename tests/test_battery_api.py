"""The new-user battery (issue 27, item 7), the Python API and the file outputs: what
raised IndexError or AttributeError is one SpecError line; an odd dtype choice is a stated
warning; a report or sweep cut by Ctrl-C leaves no partial file; expert skew never makes
the busiest device's share of the routed pairs smaller."""

import itertools

import numpy as np
import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.cost.layers import experts_touched
from perfmodel.cost.routing import device_imbalance, place, unbalanced_imbalance, zipf_popularity
from perfmodel.cost.step import Dtypes, Step, price_step
from perfmodel.schedules import sweep

runner = CliRunner()


def _one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_a_mixed_step_of_two_numbers_is_a_spec_error():
    with pytest.raises(pm.SpecError) as exc:
        Step.mixed([(1, 512)])
    assert _one_line(exc) == ("step: mixed: expected groups of (count, new_tokens, "
                              "context), got (1, 512)")
    with pytest.raises(pm.SpecError, match="got 'nothing'"):
        Step.mixed([])
    assert len(Step.mixed([(1, 512, 512), (3, 1, 900)])) == 1


@pytest.mark.parametrize("call", [lambda: pm.Workloads.grid(batch=[]),
                                  lambda: pm.Workloads.of(batch=[]),
                                  lambda: pm.Workloads.grid(batch=[1, 2], kv_dtype=[])])
def test_an_empty_axis_is_a_spec_error(call):
    with pytest.raises(pm.SpecError) as exc:
        call()
    assert "an empty list, expected at least one value" in _one_line(exc)


def test_price_step_with_hardware_and_model_swapped_names_the_argument():
    hw, model = pm.hardware("h100-sxm"), pm.model("llama-2-7b")
    step, dtypes = Step.uniform(4, 1, 512), Dtypes.of()
    with pytest.raises(pm.SpecError) as exc:
        price_step(hw, model, pm.Parallelism(), step, dtypes)
    assert _one_line(exc).startswith("price_step: argument 'model' must be a Model record")
    with pytest.raises(pm.SpecError, match=r"argument 'hw' .* got type str .*load it first"):
        price_step(model, "h100-sxm", pm.Parallelism(), step, dtypes)
    assert price_step(model, hw, pm.Parallelism(), step, dtypes).time.sum() > 0


def test_fp4_activations_under_bf16_weights_are_a_stated_warning():
    hw, model = pm.hardware("h100-sxm"), pm.model("llama-2-7b")
    est = pm.estimate(hw, model, pm.Workload(act_dtype="fp4"))
    said = [w for w in est.warnings if "narrower" in w]
    assert said == ["activations fp4 narrower than the bf16 weights: the matmuls run at bf16 "
                    "(the wider operand) on activations stored as fp4; engines quantize "
                    "activations only with the weights (W8A8, W4A4): no engine serves this"]
    both = pm.estimate(hw, model, pm.Workload(act_dtype="fp4", weights_dtype="fp4"))
    assert not [w for w in both.warnings if "narrower" in w]
    result = runner.invoke(app, ["estimate", "-m", "llama-2-7b", "-H", "h100-sxm",
                                 "--act-dtype", "fp4"])
    assert result.exit_code == 0 and "activations fp4 narrower" in result.stdout


@pytest.mark.parametrize(("experts", "top_k", "ep"), [(8, 2, 2), (8, 2, 8), (64, 6, 4),
                                                      (128, 8, 16), (256, 8, 8),
                                                      (256, 8, 32)])
def test_skew_never_lightens_the_busiest_device(experts, top_k, ep):
    """Without a balancer (no replicas) the busiest device's share of the (token, expert)
    pairs is 1 at no skew, grows with skew (the seeded placements' mean is Schur-convex in
    the popularity), and never falls below what EPLB's balanced placement reaches."""
    skews = np.linspace(0.0, 3.0, 13)
    shares = device_imbalance(experts, top_k, skews, ep)
    assert shares[0] == 1.0
    assert np.all(np.diff(shares) >= -1e-9), shares
    for s, share in zip(skews[1:], shares[1:], strict=True):
        balanced = place(zipf_popularity(experts, top_k, float(s)), ep).max() * ep / top_k
        assert share >= balanced - 1e-9
    assert unbalanced_imbalance(experts, top_k, 1.0, ep) == unbalanced_imbalance.__wrapped__(
        experts, top_k, 1.0, ep)       # seeded: the same figure every time


@pytest.mark.parametrize(("name", "ep"), [("mixtral-8x7b", 2), ("qwen3-30b-a3b", 4),
                                          ("deepseek-v3", 8)])
def test_skew_never_speeds_a_step_that_touches_every_expert(name, ep):
    """A prefill of 8 x 4,096 tokens touches every expert at these skews: the MoE layer then
    waits on the busiest device's pairs, and more skew can only slow it. (A decode step of
    a few tokens reads fewer distinct experts' weights under skew, sum_i 1 - (1 - p_i)^T
    being Schur-concave: that step does get faster, on every device.)"""
    model, hw = pm.model(name), pm.hardware("h200-sxm")
    plan = pm.Parallelism(tp=ep, ep=ep)
    moe, times = model.moe, []
    for s in (0.0, 0.5, 1.0, 1.5):
        assert experts_touched(moe.n_experts, moe.top_k, 8 * 4096, s) == pytest.approx(
            moe.n_experts, rel=1e-6)
        cost = price_step(model, hw, plan, Step.uniform(8, 4096, 4096, expert_skew=s),
                          Dtypes.of(weights="fp8"))
        times.append(float(cost.time.sum()))
    assert all(b >= a * (1 - 1e-9) for a, b in itertools.pairwise(times)), times
    assert times[-1] > times[0]


def test_the_busiest_device_in_the_estimate_is_the_engines_map():
    hw, model = pm.hardware("h200-sxm"), pm.model("deepseek-v3")
    plan = pm.Parallelism(tp=8, ep=8)
    est = pm.estimate(hw, model, pm.Workload(batch=16, expert_skew=2.0, weights_dtype="fp8"),
                      plan)
    assert est.expert_imbalance == pytest.approx(unbalanced_imbalance(256, 8, 2.0, 8))
    assert est.expert_imbalance > 2.0      # it read 1.017x, as if EPLB had balanced it


def test_sweep_blocks_change_no_value():
    models, hws = [pm.model("llama-3-8b"), pm.model("mixtral-8x7b")], [pm.hardware("h100-sxm")]
    args = (models, hws, [1, 3, 8, 64], [128, 1000, 4096])
    whole = sweep.sweep(*args, kv_dtypes=["bf16", "fp8"])
    parts = list(sweep.sweep_blocks(*args, kv_dtypes=["bf16", "fp8"], block=5))
    assert len(parts) == 2 * 5         # 24 points per model in blocks of 5 (5+5+5+5+4)
    for key, column in whole.items():
        joined = sweep.concat([p[key] for p in parts])
        if isinstance(column, list):
            assert joined == column, key
        else:
            np.testing.assert_array_equal(joined, column, err_msg=key)


def test_a_multi_model_report_without_crossing_writes_the_header(tmp_path):
    result = runner.invoke(app, ["report", "-m", "llama-2-7b,llama-2-13b", "-H", "h100-sxm",
                                 "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "crossover.csv").read_text() == \
        "model,reference,quantity,context,value,below_after\n"


def _interrupt_on(monkeypatch, module, name, after: int) -> None:
    """``module.name`` raises KeyboardInterrupt (Ctrl-C) on its call number ``after``."""
    real, calls = getattr(module, name), []

    def cut(*args, **kwargs):
        calls.append(1)
        if len(calls) == after:
            raise KeyboardInterrupt
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, cut)


def test_ctrl_c_in_a_sweep_leaves_no_partial_file(tmp_path, monkeypatch):
    from perfmodel.report import tables

    _interrupt_on(monkeypatch, tables, "write_columns", 2)   # sweep.csv done, then Ctrl-C
    out = tmp_path / "s"
    result = runner.invoke(app, ["sweep", "-m", "llama-3-8b", "-H", "h100-sxm", "--batch",
                                 "1,2", "--context", "128", "--no-figures", "--out", str(out)])
    assert result.exit_code == 130 and result.stderr.strip() == "error: aborted"
    assert not out.exists()          # the folder made for the run is gone (issue 33)


def test_ctrl_c_in_a_report_keeps_the_old_files_whole(tmp_path, monkeypatch):
    from perfmodel.report import pages

    (tmp_path / "report.md").write_text("the last run's report\n")
    _interrupt_on(monkeypatch, pages, "to_html", 1)
    result = runner.invoke(app, ["report", "-m", "llama-2-7b", "-H", "h100-sxm", "--out",
                                 str(tmp_path)])
    assert result.exit_code != 0
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]
    assert (tmp_path / "report.md").read_text() == "the last run's report\n"
