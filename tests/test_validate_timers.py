"""Timer statistics, cache rotation counts and the CSV log's resume behaviour."""

import pytest

from validate.records import KERNEL_COLUMNS, KERNEL_KEY, MeasurementLog

torch = pytest.importorskip("torch")

from validate.device import DeviceInfo  # noqa: E402
from validate.timers import measure, rotation_sets, stats  # noqa: E402

CPU = DeviceInfo("cpu", "test cpu", 1, 32 * 2**20, 1, "host")


def test_stats():
    t = stats([3.0, 1.0, 2.0, 10.0, 2.0], inner=4)
    assert (t.median_s, t.min_s, t.max_s, t.repeats, t.inner) == (2.0, 1.0, 10.0, 5, 4)
    assert t.std_s == pytest.approx(3.6469, abs=1e-4)       # sample standard deviation
    assert stats([5.0]).std_s == 0.0
    with pytest.raises(ValueError):
        stats([])


def test_rotation_sets():
    llc = 32 * 2**20
    assert rotation_sets(1e3, llc) == 512                    # capped
    assert rotation_sets(8 * 2**20, llc) == 8                # 2 x LLC / 8 MiB
    assert rotation_sets(1e9, llc) == 1                      # one huge set is allowed
    assert rotation_sets(64 * 2**20, llc) == 2               # never the same set twice


def test_measure_median_and_rotation():
    seen = []

    def call(i):
        seen.append(i)
        return sum(range(200))

    t = measure(call, CPU, repeats=7, min_repeats=3, warmup_s=0.0, sample_s=1e-4,
                budget_s=0.05)
    assert 3 <= t.repeats <= 7 and t.inner >= 1
    assert 0 < t.min_s <= t.median_s <= t.max_s
    assert seen == list(range(len(seen)))                    # every call a fresh index


def row(m, busy=0.0, measured=1e-5):
    return {"op": "gemm", "dtype": "fp32", "m": m, "n": 64, "k": 64, "threads": 2,
            "measured_s": measured, "others_busy": busy}


def test_log_resumes_and_cuts_partial_line(tmp_path):
    path = tmp_path / "m.csv"
    log = MeasurementLog(path, KERNEL_COLUMNS, KERNEL_KEY)
    log.append(row(64))
    log.append(row(128))
    log.append(row(256, busy=0.9))                       # contended: to be measured again
    with path.open("a") as f:
        f.write("localhost,src,,1,gemm,fp32,512,64")     # killed mid-row
    again = MeasurementLog(path, KERNEL_COLUMNS, KERNEL_KEY)
    assert again.has(row(64.0)) and again.has(row("128"))
    assert not again.has(row(256)) and not again.has(row(512))
    assert [r["m"] for r in again.todo([row(64), row(256), row(512)])] == [256, 512]
    again.append(row(256, measured=2e-5))
    assert path.read_text().count("\n") == 5             # header + 4 rows, no fragment
    latest = {r["m"]: r["measured_s"] for r in MeasurementLog(
        path, KERNEL_COLUMNS, KERNEL_KEY).latest()}
    assert latest == {"64": "1e-05", "128": "1e-05", "256": "2e-05"}


def test_log_refuses_foreign_csv(tmp_path):
    from perfmodel.specs import SpecError

    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(SpecError, match=r"x\.csv: column op: missing"):
        MeasurementLog(tmp_path / "x.csv", KERNEL_COLUMNS, KERNEL_KEY)
