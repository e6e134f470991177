"""The harness on tiny shapes on CPU: kernels built from Ops, correctness of the attention
and rotary forms, the local model against the operator list, a suite run and its resume."""

import csv
from dataclasses import replace

import numpy as np
import pytest

from perfmodel.compare import op_row, row_op
from perfmodel.specs import Model

torch = pytest.importorskip("torch")
F = torch.nn.functional

from validate import kernels, runner  # noqa: E402
from validate.device import open_device  # noqa: E402
from validate.records import KERNEL_COLUMNS, KERNEL_KEY, MeasurementLog, contended  # noqa: E402
from validate.report import write_report  # noqa: E402
from validate.suites import Step, Suite, kernel_rows  # noqa: E402
from validate.tinymodel import TinyLlama  # noqa: E402

MICRO = Model(name="micro-llama", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16,
              vocab_size=128, intermediate_size=96)
TINY_ROWS = [
    {"op": "gemm", "dtype": "fp32", "m": 64, "n": 64, "k": 64},
    {"op": "attention", "dtype": "fp32", "batch": 1, "q_len": 1, "kv_len": 32, "n_heads": 4,
     "n_kv_heads": 2, "head_dim": 16},
    {"op": "rms_norm", "dtype": "fp32", "m": 4, "n": 64},
]


@pytest.fixture(autouse=True)
def fast(monkeypatch):
    monkeypatch.setattr(runner, "KERNEL_BUDGET_S", 0.01)
    monkeypatch.setattr(runner, "STEP_BUDGET_S", 0.01)
    monkeypatch.setattr(runner, "wait_quiet", lambda dev: 0.0)


@pytest.fixture(scope="module")
def cpu():
    return open_device("cpu", threads=1)


def test_tiny_kernels(cpu):
    for row in TINY_ROWS:
        out = runner.measure_kernel(row, cpu, "test-cpu")
        assert out["measured_s"] > 0 and out["timing"] == "host" and out["threads"] == 1
        assert out["device"] == "test-cpu" and out["device_name"] == cpu.name
    k = kernels.build(row_op(TINY_ROWS[0]), cpu, n_sets=3)
    assert k.n_sets == 3 and tuple(k.call(4).shape) == (64, 64)


def test_kernels_from_step_records_match_their_rows(cpu):
    """A step's operator and the measurement row it becomes build the same kernel."""
    for rec in Step("layer", MICRO, 2, 1, 16).ops():
        alone = kernels.build(rec, cpu, n_sets=2)
        via_row = kernels.build(row_op(op_row(rec)), cpu, n_sets=2)
        assert alone.set_bytes == via_row.set_bytes > 0, rec.name
        assert alone.call(1).shape == via_row.call(1).shape, rec.name
    with pytest.raises(ValueError, match="one operator instance"):
        kernels.build(Step("layer", MICRO, 2, 1, 16).records()[0].take(np.array([0, 0])), cpu)


def test_attention_forms_match_reference():
    g = torch.Generator().manual_seed(0)
    q1 = torch.randn(2, 4, 1, 8, generator=g)
    k, v = torch.randn(2, 2, 10, 8, generator=g), torch.randn(2, 2, 10, 8, generator=g)
    ref = F.scaled_dot_product_attention(q1, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    assert torch.allclose(kernels.attention(q1, k, v), ref, atol=1e-5)     # folded decode
    q3 = torch.randn(2, 4, 3, 8, generator=g)                             # chunk after 7
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    full = F.scaled_dot_product_attention(torch.cat([torch.zeros(2, 4, 7, 8), q3], 2), kr, vr,
                                          is_causal=True)[:, :, 7:]
    assert torch.allclose(kernels.attention(q3, k, v), full, atol=1e-5)


def test_rotary_matches_rotate_pairs():
    x = torch.randn(3, 2 * 8)
    pos = torch.tensor([0, 5, 9])
    out = kernels.rotary(x, kernels.rotary_freqs(pos, 8))
    inv = 10000.0 ** (-torch.arange(0, 8, 2).float() / 8)
    ang = (pos[:, None] * inv)[:, None, :]                     # [3, 1, 4]
    a, b = x.view(3, 2, 4, 2).unbind(-1)
    ref = torch.stack([a * ang.cos() - b * ang.sin(), a * ang.sin() + b * ang.cos()], -1)
    assert torch.allclose(out, ref.reshape(3, 16), atol=1e-5)


def test_tiny_model_step_and_layer():
    net = TinyLlama(MICRO, "fp32", torch.device("cpu"), batch=2, max_context=16)
    ids = net.random_ids(5, torch.Generator().manual_seed(1))
    assert tuple(net.step(ids, 0).shape) == (2, 128)
    assert tuple(net.step(ids[:, :1], 5).shape) == (2, 128)      # decode at context 6
    # decoding the last prompt token reproduces the prefill's last logits
    net2 = TinyLlama(MICRO, "fp32", torch.device("cpu"), batch=2, max_context=16)
    full = net2.step(ids, 0)
    net2.step(ids[:, :4], 0)
    assert torch.allclose(net2.step(ids[:, 4:], 4), full, atol=1e-4)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_layer_bytes_are_the_layers_matrices_and_cache(dtype):
    """The rotation size of a layer step: the bytes of the projection matrices and the KV
    cache the local model allocates for one layer (norm weights are negligible, left out)."""
    step = Step("layer", MICRO, 3, 1, 16, dtype)
    net = TinyLlama(MICRO, dtype, torch.device("cpu"), batch=3, max_context=16)
    w = net.layers[0]
    held = sum(t.numel() * t.element_size()
               for t in (w.qkv, w.o, w.gate_up, w.down, w.k_cache, w.v_cache))
    assert runner._layer_bytes(step) == held


SUITE = Suite("micro", tuple(TINY_ROWS + kernel_rows(MICRO, [(1, 1, 8)], "fp32")[:2]),
              (Step("layer", MICRO, 1, 4, 4), Step("model", MICRO, 1, 1, 8)))


def test_suite_run_and_resume(cpu, tmp_path):
    suite = SUITE
    kernel_log, step_log = runner.run_suite(suite, cpu, tmp_path, "test-cpu", progress=False)
    assert len(kernel_log.rows) == 5 and len(step_log.rows) == 2
    with (tmp_path / "measurements.csv").open() as f:
        header = next(csv.reader(f))
    assert header[:17] == ["device", "source", "model", "tp", "op", "dtype", "m", "n", "k",
                           "batch", "q_len", "kv_len", "n_heads", "n_kv_heads", "head_dim",
                           "measured_s", "measured_std_s"]
    assert {"timing", "threads", "device_name"} <= set(header)
    again, _ = runner.run_suite(suite, cpu, tmp_path, "test-cpu", progress=False)
    assert len(again.rows) == 5                                   # nothing measured twice


def test_suite_passes_interleave_kernels_and_steps(cpu, tmp_path):
    kernel_log, step_log = runner.run_suite(SUITE, cpu, tmp_path, "test-cpu", progress=False,
                                            passes=2)
    assert len(kernel_log.rows) == 5 and len(step_log.rows) == 2
    assert {r["passes"] for r in kernel_log.rows + step_log.rows} == {"2"}
    for name, n in (("measurements.passes.csv", 5), ("steps.passes.csv", 2)):
        with (tmp_path / name).open() as f:
            rows = list(csv.DictReader(f))
        assert sorted(r["pass"] for r in rows) == ["0"] * n + ["1"] * n
    # each kept row is its configuration's fastest pass
    with (tmp_path / "measurements.passes.csv").open() as f:
        raw = list(csv.DictReader(f))
    for row in kernel_log.rows:
        same = [float(r["measured_s"]) for r in raw if kernel_log.key(r) == kernel_log.key(row)]
        assert float(row["measured_s"]) == min(same)


def test_passes_keep_the_fastest_and_resume(cpu, tmp_path):
    """Each configuration is measured once per pass, pass after pass, into the raw CSV; the
    log keeps the fastest pass; an interrupted run measures only the passes it lacks."""
    rows = [dict(TINY_ROWS[0]), dict(TINY_ROWS[2])]
    names = [r["op"] + str(r["m"]) + str(r["n"]) for r in rows]
    seconds = {names[0]: [3.0, 1.0, 2.0], names[1]: [5.0, 6.0, 7.0]}   # by pass
    calls: list[tuple[str, int]] = []

    def fake(row, dev, label, seed=0):
        name = row["op"] + str(row["m"]) + str(row["n"])
        p = sum(1 for c in calls if c[0] == name)
        calls.append((name, p))
        return dict(row) | {"measured_s": seconds[name][p], "device": label, "threads": dev.threads,
                            "others_busy": 0.0}

    def run(passes: int) -> MeasurementLog:
        log = MeasurementLog(tmp_path / "m.csv", KERNEL_COLUMNS, KERNEL_KEY)
        runner._run(rows, dict, fake, cpu, log, "t", False, "k", "config", passes)
        return log

    log = run(3)
    assert [p for _, p in calls] == [0, 0, 1, 1, 2, 2]      # pass after pass
    best = {r["op"] + r["m"] + r["n"]: (float(r["measured_s"]), r["passes"]) for r in log.rows}
    assert best == {names[0]: (1.0, "3"), names[1]: (5.0, "3")}
    raw = tmp_path / "m.passes.csv"
    lines = raw.read_text().splitlines(keepends=True)
    assert len(lines) == 7                                  # header and 2 configs x 3 passes
    # interrupted during the last pass: the log and that pass are lost
    raw.write_text("".join(lines[:5]))
    (tmp_path / "m.csv").unlink()
    calls[:] = [c for c in calls if c[1] < 2]
    log = run(3)
    assert [p for _, p in calls[4:]] == [2, 2]              # only the missing pass
    assert len(log.rows) == 2
    assert run(3).rows == log.rows and len(calls) == 6      # nothing left to measure


def test_passes_prefer_quiet_runs_and_keep_contended_only_as_a_last_resort(cpu, tmp_path,
                                                                          monkeypatch):
    """A contended pass loses to any quiet one even when faster; a configuration contended on
    every pass still gets its fastest row, flagged by others_busy (as with one pass)."""
    rows = [dict(TINY_ROWS[0]), dict(TINY_ROWS[2])]
    names = [r["op"] + str(r["m"]) + str(r["n"]) for r in rows]
    runs = {names[0]: [(2.0, 0.0), (1.0, 0.9)], names[1]: [(4.0, 0.9), (3.0, 0.8)]}
    seen: dict[str, int] = {}

    def fake(row, dev, label, seed=0):
        name = row["op"] + str(row["m"]) + str(row["n"])
        p = seen.get(name, 0)
        seen[name] = p + 1
        t, busy = runs[name][min(p, 1)]
        return dict(row) | {"measured_s": t, "device": label, "threads": dev.threads,
                            "others_busy": busy}

    monkeypatch.setattr(runner, "RETRIES", 0)           # no re-measuring a contended pass
    log = MeasurementLog(tmp_path / "m.csv", KERNEL_COLUMNS, KERNEL_KEY)
    runner._run(rows, dict, fake, cpu, log, "t", False, "k", "config", 2)
    got = {r["op"] + r["m"] + r["n"]: (float(r["measured_s"]), r["passes"], contended(r))
           for r in log.rows}
    assert got == {names[0]: (2.0, "1", False), names[1]: (3.0, "2", True)}


@pytest.mark.slow
def test_report_with_figures(cpu, tmp_path, a100):
    kernel_log, step_log = runner.run_suite(SUITE, cpu, tmp_path, "test-cpu", progress=False)
    written = write_report(tmp_path, replace(a100, name="toy"), "toy.yaml",
                           kernel_log.latest(), step_log.latest(), ["# micro"],
                           {"micro-llama": MICRO})
    text = written.path.read_text()
    assert "## Held-out kernels (5 rows)" in text and "Whole decoder layer" in text
    assert written.held_out[0] == "Held-out kernels (5 rows):"
    assert all(line in text for line in written.held_out[1:])
    for name in ("predictions.csv", "step_predictions.csv", "predicted_vs_measured.png",
                 "error_by_class.png", "roofline.png"):
        assert (tmp_path / name).is_file(), name
