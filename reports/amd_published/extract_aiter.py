"""Extract ``aiter.csv``: a small attributed sample of AITER's own kernel timings.

ROCm/aiter ships the tables its tuners measured on MI300X (gfx942, 304 CUs) and MI355X
(gfx950, 256 CUs) and that its dispatch reads at run time (``aiter/configs``): per shape
the chosen kernel and its time in microseconds (column ``us``), measured by
``aiter/test_common.py`` ``run_perftest`` (101 iterations after warm-up, torch profiler
device time):

- fp8 128 x 128 block-scaled GEMMs (``a8w8_blockscale_tuned_gemm*.csv``, columns gfx,
  cu_num, M, N, K, us; the CK ``a8w8_blockscale`` kernels: fp8 activations in 1 x 128
  groups already quantized, as ``aiter.gemm_a8w8_blockscale`` takes them);
- fused MoE (``*_tuned_fmoe*.csv``: cu_num, token, model_dim, inter_dim, expert, topk,
  q_type, us = us1 + us2, the two stages' grouped GEMMs with the activation fused; routing
  (``fused_topk`` of Gaussian scores: uniform) and ``moe_sorting`` are run outside the timed
  call, ``csrc/ck_gemm_moe_2stages_codegen/gemm_moe_tune.py`` ``generate_data``).

Plus ROCm/aiter PR 2039's MLA decode table (the "ASM (us)" columns: the default fp8
absorbed-MLA decode kernel, ``mla_decode_fwd`` with 128 query heads, one latent KV head
of 512 + 64 rope, fp8 Q and KV, page size 1; the HipKittens kernel it compares is gated on
``AITER_ENABLE_EXPERIMENTAL``, ``aiter/mla.py`` at 57ed6a01a2, and not used).

Sampled, deterministic: GEMM rows at M a power of two (powers of four for the larger
tables); every fp8-block MoE row. Rows the tuner left untimed (us 0 or inf) are counted
(printed), not written. Run (the tables from a local clone of ROCm/aiter)::

    git --git-dir=/path/to/aiter/.git archive e4048607a5 aiter/configs | tar -x -C /tmp/aiter
    python reports/amd_published/extract_aiter.py /tmp/aiter/aiter/configs
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
COMMIT = "e4048607a5"           # ROCm/aiter main, 2026-08-22
DEVICES = {"304": "mi300x", "256": "mi355x"}
COLUMNS = ("device", "source", "model", "op", "dtype", "weight_format", "m", "n", "k",
           "experts", "topk", "batch", "q_len", "kv_len", "n_heads", "n_kv_heads", "head_dim",
           "v_dim", "cache_dim", "kv_dtype", "measured_s")
# (table, model label, M powers of: 2 or 4 on MI300X; 4 on MI355X); each row's source is
# "aiter:<table name>", from aiter/configs at COMMIT
GEMMS = (("model_configs/a8w8_blockscale_tuned_gemm_ds_v3.csv", "deepseek-v3", 2),
         ("model_configs/a8w8_blockscale_tuned_gemm_glm5_1.csv", "glm-5.1", 2),
         ("model_configs/a8w8_blockscale_tuned_gemm_qwen36_27b.csv", "qwen3.6-27b", 4),
         ("model_configs/a8w8_blockscale_tuned_gemm_qwen3_vl_235b.csv", "qwen3-vl-235b", 4),
         ("model_configs/a8w8_blockscale_tuned_gemm_qwen3_vl_32b.csv", "qwen3-vl-32b", 4),
         ("model_configs/a8w8_blockscale_tuned_gemm_qwen3_235b.csv", "qwen3-235b", 4),
         ("model_configs/a8w8_blockscale_tuned_gemm_qwen3_next_80b_a3b.csv", "qwen3-next-80b", 4),
         ("a8w8_blockscale_tuned_gemm.csv", "generic", 4))
MOES = (("model_configs/a8w8_blockscale_tuned_fmoe_ds_v3.csv", "deepseek-v3"),
        ("model_configs/a8w8_blockscale_tuned_fmoe_glm5_1.csv", "glm-5.1"),
        ("model_configs/a8w8_blockscale_tuned_fmoe_glm5.csv", "glm-5"),
        ("model_configs/mimo_v2_5_pro_tuned_fmoe.csv", "mimo-v2.5-pro"),
        ("model_configs/a8w8_blockscale_tuned_fmoe_minimax-m2_5.csv", "minimax-m2.5"),
        ("model_configs/a8w8_blockscale_tuned_fmoe_qwen3_235b.csv", "qwen3-235b"),
        ("model_configs/a8w8_blockscale_tuned_fmoe_qwen3_5_397b.csv", "qwen3.5-397b"))
# ROCm/aiter PR 2039 (github.com/ROCm/aiter/pull/2039, merged as 57ed6a01a2, 2026-03-09),
# its table's "ASM (us)" columns for MI300 and MI355, batch x ctx
MLA_BATCH = (1, 3, 5, 16, 32, 64, 128, 256)
MLA_CTX = (21, 64, 256, 512, 1200, 3200, 5200, 8192)
MLA_US = {
    "mi300x": (15.491, 15.089, 15.545, 16.445, 17.406, 18.879, 20.608, 40.928,
               14.717, 15.629, 16.174, 17.222, 21.761, 20.885, 21.909, 53.850,
               15.457, 18.607, 20.083, 23.630, 27.841, 33.535, 37.518, 78.283,
               15.649, 18.510, 20.190, 25.369, 32.503, 47.793, 70.484, 118.997,
               18.857, 22.213, 24.832, 33.545, 49.243, 69.173, 111.467, 193.077,
               22.918, 26.559, 31.488, 54.434, 82.846, 134.910, 224.926, 410.581,
               26.268, 30.645, 36.625, 70.020, 113.753, 193.552, 334.434, 631.849,
               32.707, 37.842, 47.956, 95.467, 159.378, 277.698, 507.749, 967.071),
    "mi355x": (12.106, 13.021, 12.942, 13.592, 14.822, 15.120, 16.185, 20.367,
               12.640, 13.249, 13.570, 14.426, 17.563, 19.144, 19.598, 24.037,
               13.516, 14.680, 15.179, 16.592, 18.719, 22.631, 29.272, 35.111,
               13.611, 14.285, 15.425, 19.863, 21.444, 26.765, 39.112, 48.466,
               15.552, 17.116, 18.167, 22.901, 28.597, 39.773, 55.859, 85.899,
               19.134, 20.962, 23.241, 31.249, 45.933, 67.361, 111.869, 203.137,
               23.672, 25.671, 27.923, 38.713, 59.565, 94.513, 176.153, 320.164,
               28.166, 29.872, 31.737, 50.289, 79.926, 137.594, 262.967, 505.226)}


def _timed(us: str) -> float | None:
    try:
        value = float(us)
    except ValueError:
        return None
    return value * 1e-6 if math.isfinite(value) and value > 0 else None


def _power(m: int, base: int) -> bool:
    while m > 1 and m % base == 0:
        m //= base
    return m == 1


def gemm_rows(configs: Path, skipped: dict) -> list[dict]:
    out = []
    for table, model, base in GEMMS:
        for r in csv.DictReader((configs / table).open(newline="")):
            device = DEVICES.get(r["cu_num"])
            power = base if device == "mi300x" else 4     # MI355X tables are the larger
            if device is None or not _power(int(r["M"]), power) or int(r["M"]) > 16384:
                continue
            measured = _timed(r["us"])
            if measured is None:
                skipped[table] = skipped.get(table, 0) + 1
                continue
            out.append({"device": device, "source": f"aiter:{Path(table).stem}",
                        "model": model, "op": "gemm", "dtype": "fp8",
                        "weight_format": "fp8-block128", "m": r["M"], "n": r["N"],
                        "k": r["K"], "measured_s": f"{measured:.6e}"})
    return out


def moe_rows(configs: Path, skipped: dict) -> list[dict]:
    out = []
    for table, model in MOES:
        for r in csv.DictReader((configs / table).open(newline="")):
            device = DEVICES.get(r["cu_num"])
            if device is None or r["q_type"] != "QuantType.per_1x128":
                continue
            measured = _timed(r["us"])
            if measured is None:
                skipped[table] = skipped.get(table, 0) + 1
                continue
            out.append({"device": device, "source": f"aiter:{Path(table).stem}",
                        "model": model, "op": "moe", "dtype": "fp8",
                        "weight_format": "fp8-block128", "m": r["token"],
                        "n": r["model_dim"], "k": r["inter_dim"], "experts": r["expert"],
                        "topk": r["topk"], "measured_s": f"{measured:.6e}"})
    return out


def mla_rows() -> list[dict]:
    out = []
    for device, times in MLA_US.items():
        for i, us in enumerate(times):
            out.append({"device": device, "source": "aiter-pr2039", "model": "deepseek-v3",
                        "op": "attention", "dtype": "fp8", "kv_dtype": "fp8",
                        "batch": MLA_BATCH[i % 8], "q_len": 1, "kv_len": MLA_CTX[i // 8],
                        "n_heads": 128, "n_kv_heads": 1, "head_dim": 576, "v_dim": 512,
                        "cache_dim": 576, "measured_s": f"{us * 1e-6:.6e}"})
    return out


def main(configs: Path) -> None:
    skipped: dict[str, int] = {}
    rows = gemm_rows(configs, skipped) + moe_rows(configs, skipped) + mla_rows()
    with (HERE / "aiter.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    counts: dict[tuple[str, str], int] = {}
    for r in rows:
        counts[r["device"], r["op"]] = counts.get((r["device"], r["op"]), 0) + 1
    print(f"{len(rows)} rows: " + ", ".join(f"{d} {o} {n}" for (d, o), n in sorted(counts.items())))
    for table, n in skipped.items():
        print(f"  untimed (us 0 or inf), not written: {n} rows of {table}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
