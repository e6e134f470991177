"""TensorRT-LLM's MLA generation rows (aiconfigurator-core ``generation_mla_perf``,
TRT-LLM 1.3.0rc20: ``collector/trtllm/collect_mla.py``, the rope / cache-write kernel and the
absorbed attention, FlashMLA on SM90 and trtllm-gen on Blackwell) fitted and scored per
device, as the ``engines.trtllm`` block's ``attention_latent_kernel`` profile.

The profile's constants (``attention_fraction``, ``attention_program_keys``,
``attention_head_dim_half``, attention's ``memory_fraction`` and ``latency_s``) are fitted by
the corpus fit's bounded soft-L1 least squares (``validate.corpus.fit``) on these rows alone,
the block's other figures as they are. Held out: 5 folds by (heads, cache dtype); leave one
device out: the other Hopper part for H100 / H200, the other Blackwell parts for each.
Where the block sets trtllm-gen's CTA rule (``attention_latent_cta_rows``, Blackwell), the
16-bit and FP8-cache builds are fitted apart (``trtllm_gen_mla`` and ``trtllm_gen_mla@fp8``,
each with its fixed time per CTA, ``attention_cta_s``) in one least squares with one
``attention_restream_fraction`` for both.

    perfmodel kernels import aiconfigurator --out /tmp/corpus --device h100-sxm \\
        --device h200-sxm --device b200 --engine trtllm
    python reports/kernels/trtmla/fit.py /tmp/corpus h100-sxm h200-sxm b200
"""

from __future__ import annotations

import math
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
from validate.corpus.fit import soft_l1, summary
from validate.corpus.params import PARAMETERS, _start, apply
from validate.corpus.sets import KernelSet, fold_of

SHARED = "attention_restream_fraction"
CTA = "attention_cta_s"             # fitted per build where ``split``
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


def split(hw) -> bool:
    """Whether ``hw``'s MLA kernel is fitted per cache dtype with its head-tile streams:
    trtllm-gen's (the block sets ``attention_latent_cta_rows``), whose FP8-cache build is a
    kernel of its own (``trtllm_gen_mla@fp8``: dtypeQ = dtypeKv = E4M3, the query quantized
    by the rope kernel, ``attention_q_cast_fused``)."""
    return hw.efficiency.attention_latent_sched == "trtllm_gen"


def own_names(hw) -> tuple[str, ...]:
    """The profile's fitted names on ``hw``: with trtllm-gen's rule also its time per CTA;
    under FlashMLA's scheduler a program's fixed work is the scheduler's 5 blocks a sequence
    (``latent_tiles.flashmla_fill``), not a fitted count."""
    sched = hw.efficiency.attention_latent_sched
    if sched == "flashmla":
        return tuple(n for n in NAMES if n != "attention_program_keys")
    return (*NAMES, CTA) if sched else NAMES


def block(hw, fp8: bool = False):
    """``hw``'s block as the fit prices the rows: its own constants on the latent calls,
    without its own decode kernel's (XQA's, ``attention_kernels.DECODE_KERNEL_OFF``); with
    ``fp8``, computing in FP8 on a query cast by an earlier kernel."""
    cast = {"attention_q_cast": True, "attention_q_cast_fused": True} if fp8 else {}
    return replace(hw, efficiency=replace(hw.efficiency, attention_latent_kernel="",
                                          **DECODE_KERNEL_OFF, **cast))


def parts(hw, s: KernelSet) -> list[tuple[str, object, KernelSet]]:
    """(profile suffix, priced block, rows) of ``s``: one part, or its 16-bit and FP8-cache
    rows apart where ``split``."""
    if not split(hw):
        return [("", block(hw), s)]
    fp8 = s.columns["kv_bytes"] == 1
    return [(tag, block(hw, tag == "@fp8"), s.take(np.flatnonzero(m)))
            for tag, m in (("", ~fp8), ("@fp8", fp8)) if m.any()]


def fit(pairs: list) -> dict[str, float]:
    """Profile values, keyed ``name`` or ``name@fp8``; the restream share is one for both
    builds (the same CTA tiling), so a held-out head count of one dtype is priced by it."""
    work = [p for hw, s in pairs for p in parts(hw, s)]
    tags = sorted({t for t, _, _ in work})
    shared = (SHARED,) if any(hw.efficiency.attention_latent_cta_rows for hw, _ in pairs) \
        else ()
    own = own_names(pairs[0][0])
    names = [*shared, *(n + t for t in tags for n in own)]
    return _joint(work, names)


def _joint(work: list, names: list[str]) -> dict[str, float]:
    """``corpus.fit._stage``'s bounded soft-L1 least squares over parts each priced with
    its own tag's values and the shared ones."""
    from scipy.optimize import least_squares

    weight = 1.0 / math.sqrt(sum(len(s) for _, _, s in work))
    entry = [n.split("@")[0] for n in names]

    def values(x: np.ndarray, tag: str) -> dict[str, float]:
        return {e: float(math.exp(v)) for n, e, v in zip(names, entry, x, strict=True)
                if n == e + tag or n == SHARED}

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.concatenate([soft_l1(np.log(s.predict(apply(hw, values(x, t)))
                                              / s.measured_s), np.full(len(s), weight))
                               for t, hw, s in work])

    lo = np.log([PARAMETERS[e][0] for e in entry])
    hi = np.log([PARAMETERS[e][1] for e in entry])
    sol = least_squares(residuals, np.array([_start(e) for e in entry]), bounds=(lo, hi),
                        diff_step=1e-3, max_nfev=60)
    return {n: float(math.exp(v)) for n, v in zip(names, sol.x, strict=True)}


def errors(hw, s: KernelSet, values: dict[str, float]) -> np.ndarray:
    """Each row's error on ``values`` (``fit``'s keys), in ``s``'s row order."""
    out = np.empty(len(s))
    fp8 = s.columns["kv_bytes"] == 1
    for tag, view, part in parts(hw, s):
        mine = {n.split("@")[0]: v for n, v in values.items()
                if n == SHARED or (n.endswith(tag) and (tag or "@" not in n))}
        rows = np.flatnonzero(fp8 if tag else ~fp8) if split(hw) else np.arange(len(s))
        out[rows] = part.errors(apply(view, mine))
    return out


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
        print("  profile   " + ", ".join(f"{PROFILE.get(k.split('@')[0], k.split('@')[0])}"
                                         f"{'@fp8' if k.endswith('@fp8') else ''}: {v:.4g}"
                                         for k, v in values.items()))
        held = []
        for f in range(5):
            train, test = s.take(np.flatnonzero(s.fold != f)), s.take(np.flatnonzero(s.fold == f))
            if len(test):
                held.append(errors(hw, test, fit([(hw, train)])))
        print(line("held-out", np.concatenate(held)))
        kin = [o for o in devices if o != d and family_of(o) == family_of(d)]
        others = kin or [o for o in devices if o != d]
        lodo = fit([(hws[o], sets[o]) for o in others])
        print(line("lodo", errors(hw, s, lodo)) + f"  (fitted on {', '.join(others)})")
        e = errors(hw, s, values)
        print(line("in-sample", e))
        for heads in np.unique(s.columns["n_heads"]):
            for kv in (2.0, 1.0):
                m = (s.columns["n_heads"] == heads) & (s.columns["kv_bytes"] == kv)
                print(f"    {int(heads):3d} heads kv {int(kv)}B  median {np.median(e[m]):+.1%}"
                      f"  |e| {np.median(np.abs(e[m])):.1%}")


if __name__ == "__main__":
    main()
