"""TensorRT-LLM's attention rows (aiconfigurator-core ``generation_attention_perf`` and
``context_attention_perf``, TRT-LLM 1.3.0rc20, torch flow) fitted and scored per device with
the ``engines.trtllm`` block's mechanisms (XQA tiles, groups and dispatch, the MMHA
fallback).

The attention stage of ``corpus.fit`` alone is fitted (bounded soft-L1 least squares, at
most 2,500 rows per class, deterministic), the block's GEMM figures as they are, on the
rows ``perfmodel calibrate --from`` fits (16-bit cache, no window, head_dim <= 256; context
rows at a bf16 FMHA). Every row is then scored with the fit's constants ("all rows": fp8
caches, windows, head_dim 512 too).

    perfmodel kernels import aiconfigurator --out /tmp/corpus --device h100-sxm \
        --device h200-sxm --device b200 --engine trtllm
    python reports/kernels/trtattn/fit.py /tmp/corpus h100-sxm h200-sxm b200 [--before]

Prints per device and class: the shipped block's median |error|, the fitted constants, the
held-out median |error| with its q10/q90 (5 folds by heads x KV heads x head_dim), the
leave-one-device-out one (the family's other devices fitted together; a device alone in its
family: the others, across families) and every row's. ``--before`` prices with the
mechanisms off (the tree before this change: tile 8 on Hopper, no fallback) and refits.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from perfmodel.cost.decode_fallback import fallback_mask
from perfmodel.cost.ops import Attention
from perfmodel.kernels.corpus import read_file
from perfmodel.specs.load import hardware
from validate.corpus.calibrate import family_of
from validate.corpus.fit import fit_devices, held_out, summary
from validate.corpus.params import apply
from validate.corpus.rows import newest, typed
from validate.corpus.sets import attention_sets

CLASSES = ("attention_decode", "attention_prefill")


def sets_of(folder: Path, device: str) -> list:
    """The device's TRT-LLM attention rows as the fit's kernel sets."""
    df = read_file(folder / f"{device}__trtllm.csv.gz")
    df = df[df["table"].isin(["generation_attention_perf", "context_attention_perf"])]
    df = df[(df["kernel"] == "torch_flow") & (df["dtype"] == "bf16")]
    df = typed(newest(df.reset_index(drop=True)))
    kv_bytes = np.where(df["kv_dtype"] == "fp8", 1.0, 2.0)
    return attention_sets(df["batch"], df["q_len"], df["kv_len"], df["n_heads"],
                          df["n_kv_heads"], df["head_dim"], df["window"].fillna(0), kv_bytes,
                          df["measured_s"].to_numpy(), f"{device}/attention/trtllm")


def before_view(hw):
    """``hw`` as the tree before the dispatch priced it: the 8-row tile for every cache, no
    fallback kernel, FlashAttention's splits, decode on the context kernel's constants."""
    return replace(hw, efficiency=replace(
        hw.efficiency, attention_decode_tile_q=8 if hw.efficiency.attention_decode_tile_q
        else 0, attention_decode_tile_q_fp8=0, attention_decode_min_group=0,
        attention_decode_max_group=0, attention_fallback_fraction=0.0,
        attention_decode_min_waves=0.0, attention_decode_splits="",
        attention_decode_fraction=None, attention_decode_program_keys=0.0,
        attention_decode_head_dim_half=0.0, attention_decode_latency_s=0.0))


def line(name: str, table: dict) -> str:
    return f"  {name:10s} " + "  ".join(
        f"{k} {v['median_abs']:.1%} (bias {v['median']:+.1%}, n {v['n']})"
        for k, v in table.items())


def fallback_rows(hw, s):
    """The decode rows of ``s`` that run the fallback kernel on ``hw``
    (``cost.decode_fallback.fallback_mask`` of each row as one decode)."""
    c = s.columns
    op = Attention(batch=c["batch"][:, None], q_len=c["q_len"][:, None],
                   kv_len=c["kv_len"][:, None], n_heads=c["n_heads"],
                   n_kv_heads=c["n_kv_heads"], qk_dim=c["head_dim"], v_dim=c["head_dim"],
                   cache_elems=2 * c["head_dim"], window=c["window"], kv_bytes=c["kv_bytes"])
    decode = np.ones((len(s), 1), dtype=bool)
    return s.take(np.flatnonzero(fallback_mask(op, hw, decode)[:, 0]))


def calibrated(s):
    """The rows ``perfmodel calibrate --from`` fits (``corpus.rows._main_kernel``): a 16-bit
    cache, no window, head_dim up to 256."""
    c = s.columns
    return s.take(np.flatnonzero((c["kv_bytes"] == 2) & (c["window"] == 0)
                                 & (c["head_dim"] <= 256)))


def table(sets, hw) -> dict:
    return {s.error_class: summary(s.errors(hw)) for s in sets}


def main() -> None:
    folder, devices = Path(sys.argv[1]), [a for a in sys.argv[2:] if not a.startswith("--")]
    old = "--before" in sys.argv
    hws = {d: hardware(d, "trtllm") for d in devices}
    if old:
        hws = {d: before_view(hw) for d, hw in hws.items()}
    every = {d: [s for s in sets_of(folder, d) if s.error_class in CLASSES] for d in devices}
    fit_on = {d: [calibrated(s) for s in sets] for d, sets in every.items()}
    for d in devices:
        hw, mine = hws[d], fit_on[d]
        print(f"{d} ({'before: tile 8, no fallback' if old else 'this change'})")
        print(line("shipped", table(mine, hw)))
        values = fit_devices([(hw, mine)])
        print("  fitted     " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(values.items())))
        if hw.efficiency.attention_fallback_fraction:
            print(f"  fallback   {len(fallback_rows(hw, mine[0]))} of {len(mine[0])} decode rows")
        held = {k: summary(v) for k, v in held_out(hw, mine).items()}
        print(line("held-out", held) + "  q10/q90 " + ", ".join(
            f"{k} {v['q10']:+.3f}/{v['q90']:+.3f}" for k, v in held.items()))
        kin = [o for o in devices if o != d and family_of(o) == family_of(d)]
        others = kin or [o for o in devices if o != d]      # else across families
        if others:
            lodo = fit_devices([(hws[o], fit_on[o]) for o in others])
            print(line("lodo", table(mine, apply(hw, lodo)))
                  + f"  (fitted on {', '.join(others)})")
        print(line("all rows", table(every[d], apply(hw, values)))
              + "  (fp8 caches, windows, head_dim 512 too; the fit's constants)")


if __name__ == "__main__":
    main()
