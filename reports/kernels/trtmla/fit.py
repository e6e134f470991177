"""TensorRT-LLM's MLA generation rows (aiconfigurator-core ``generation_mla_perf``,
TRT-LLM 1.3.0rc20: ``collector/trtllm/collect_mla.py``, the rope / cache-write kernel and the
absorbed attention, FlashMLA on SM90 and trtllm-gen on Blackwell) fitted and scored per
device, as the ``engines.trtllm`` block's ``attention_latent_kernel`` profile.

The profile's constants (``attention_fraction``, ``attention_program_keys``,
``attention_head_dim_half``, attention's ``memory_fraction`` and ``latency_s``) are fitted by
the corpus fit's bounded soft-L1 least squares (``validate.corpus.fit``) on these rows alone,
the block's other figures as they are. Held out: 5 folds by (heads, cache dtype); leave one
device out: the other Hopper part for H100 / H200, both for B200.

    perfmodel kernels import aiconfigurator --out /tmp/corpus --device h100-sxm \\
        --device h200-sxm --device b200 --engine trtllm
    python reports/kernels/trtmla/fit.py /tmp/corpus h100-sxm h200-sxm b200
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from perfmodel.cost.attention_kernels import DECODE_KERNEL_OFF
from perfmodel.cost.ops import Attention, KvWrite
from perfmodel.cost.roofline import op_time
from perfmodel.kernels.corpus import read_file
from perfmodel.specs.dtypes import CODE
from perfmodel.specs.load import hardware
from validate.corpus.calibrate import family_of
from validate.corpus.fit import _stage, summary
from validate.corpus.params import apply
from validate.corpus.sets import KernelSet, fold_of

NAMES = ("attention_fraction", "attention_program_keys", "attention_head_dim_half",
         "memory_fraction.attention", "kernel_latency_s.attention")
PROFILE = {"attention_fraction": "attention_fraction",
           "attention_program_keys": "attention_program_keys",
           "attention_head_dim_half": "attention_head_dim_half",
           "memory_fraction.attention": "memory_fraction",
           "kernel_latency_s.attention": "latency_s"}
LATENT, ROPE_V = 576.0, 512.0       # DeepSeek-V3's latent + rope, and V


def price_mla(c: dict[str, np.ndarray], hw) -> np.ndarray:
    """One generation row: the new token's latent written to the cache, then the absorbed
    attention (one KV head, Q/K 576 wide, V 512) over ``step`` + 1 positions."""
    att = Attention(batch=c["batch"][:, None], q_len=np.ones_like(c["batch"])[:, None],
                    kv_len=c["kv_len"][:, None], n_heads=c["n_heads"],
                    n_kv_heads=np.ones_like(c["n_heads"]), qk_dim=LATENT, v_dim=ROPE_V,
                    cache_elems=LATENT, window=0.0, act_bytes=2.0, kv_bytes=c["kv_bytes"],
                    dtype=CODE["bf16"])
    write = KvWrite(rows=c["batch"], n=LATENT, act_bytes=2.0, kv_bytes=c["kv_bytes"],
                    dtype=CODE["bf16"])
    return op_time(att, hw, "kernel").time_s + op_time(write, hw, "kernel").time_s


def mla_set(folder: Path, device: str) -> KernelSet:
    df = read_file(folder / f"{device}__trtllm.csv.gz")
    df = df[df["table"] == "generation_mla_perf"].reset_index(drop=True)
    kv = np.where(df["kv_dtype"].astype(str) == "fp8", 1.0, 2.0)
    cols = {"batch": df["batch"].to_numpy(float), "kv_len": df["kv_len"].to_numpy(float),
            "n_heads": df["n_heads"].to_numpy(float), "kv_bytes": kv}
    return KernelSet("attention_decode", cols, df["measured_s"].to_numpy(float),
                     fold_of(cols["n_heads"], kv), price_mla, f"{device}/mla/trtllm")


def block(hw):
    """``hw``'s block as the fit prices the rows: its own constants on the latent calls,
    without its own decode kernel's (XQA's, ``attention_kernels.DECODE_KERNEL_OFF``)."""
    return replace(hw, efficiency=replace(hw.efficiency, attention_latent_kernel="",
                                          **DECODE_KERNEL_OFF))


def fit(pairs: list) -> dict[str, float]:
    return _stage([(block(hw), [s]) for hw, s in pairs], NAMES, max_nfev=60)


def line(name: str, errors: np.ndarray) -> str:
    s = summary(errors)
    return (f"  {name:9s} {s['median_abs']:.1%} (bias {s['median']:+.1%}, q10/q90 "
            f"{s['q10']:+.3f}/{s['q90']:+.3f}, n {s['n']})")


def main() -> None:
    folder, devices = Path(sys.argv[1]), sys.argv[2:]
    hws = {d: hardware(d, "trtllm") for d in devices}
    sets = {d: mla_set(folder, d) for d in devices}
    for d in devices:
        hw, s = hws[d], sets[d]
        print(d)
        print(line("shipped", s.errors(hw)))
        values = fit([(hw, s)])
        print("  profile   " + ", ".join(f"{PROFILE[k]}: {v:.4g}" for k, v in values.items()))
        held = []
        for f in range(5):
            train, test = s.take(np.flatnonzero(s.fold != f)), s.take(np.flatnonzero(s.fold == f))
            if len(test):
                held.append(test.errors(apply(block(hw), fit([(hw, train)]))))
        print(line("held-out", np.concatenate(held)))
        kin = [o for o in devices if o != d and family_of(o) == family_of(d)]
        others = kin or [o for o in devices if o != d]
        lodo = fit([(hws[o], sets[o]) for o in others])
        print(line("lodo", s.errors(apply(block(hw), lodo))) + f"  (fitted on {', '.join(others)})")
        print(line("in-sample", s.errors(apply(block(hw), values))))
        for heads in np.unique(s.columns["n_heads"]):
            mine = s.take(np.flatnonzero(s.columns["n_heads"] == heads))
            e = mine.errors(apply(block(hw), values))
            print(f"    {int(heads):3d} heads  median {np.median(e):+.1%}"
                  f"  |e| {np.median(np.abs(e)):.1%}")


if __name__ == "__main__":
    main()
