"""Tiny recurrent layers in torch: a Mamba-2 SSD scan and a gated delta-rule scan, measured
on the CPU beside the predictions of their ``cost.scan`` records.

    python -m validate.recurrent > reports/cpu/recurrent.md

References (pure torch, fp32, written here; layouts [batch, tokens, heads, dim]):
- ``ssd_chunked``: Mamba-2's SSD (arXiv 2405.21060, the "minimal" discrete form) over
  chunks of Q tokens, all chunks at once: the within-chunk quadratic form C B^T masked by
  the decay, the chunk states B^T X, then the state passed chunk to chunk (a loop of
  T / Q steps) and read by each chunk's C. ``ssd_step``: h = a h + B x^T, y = C h.
- ``delta_chunked``: the gated delta rule (Gated DeltaNet, arXiv 2412.06464) in the WY /
  UT form of flash-linear-attention's reference ``chunk_gated_delta_rule``: per chunk
  T = (I + strict_lower(beta K K^T * decay))^-1 (one batched triangular solve), U = T V,
  W = T K, then a loop over chunks correcting U by W S. ``delta_step``: S = a S,
  S += beta k (v - S^T k)^T, o = S^T q (S is [d_k, d_v]).

Each chunked scan equals its step applied token by token (``tests/test_validate_recurrent``).
Timing: ``validate.timers.measure`` (warm-up, median of samples, host clock), inputs rotated
beyond the last-level cache. Prediction: ``op_time`` of the ``Scan`` / ``LinearScan`` record
of the same shape at fp32 on the calibrated CPU file, timing ``host``; the file runs the scan
unfused (``efficiency.scan_kernel``), so the record is priced as the chain of torch
operators these references dispatch (``cost.scan_chain``), and beside it as the one fused
kernel a GPU runs. Every call's aten operators are counted (a ``TorchDispatchMode``: each
operator called from Python, views included) and the matmul share of its time profiled,
to set against the chain's dispatches and its matmuls' predicted time.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from perfmodel.cost.roofline import op_time
from perfmodel.cost.scan import LinearScan, Scan
from perfmodel.cost.scan_chain import chain, totals
from perfmodel.specs.dtypes import dtype_code
from perfmodel.specs.load import load_hardware

HARDWARE = Path("reports/cpu/hardware.yaml")
HEADS, GROUPS, D_K, D_V, CHUNK = 4, 1, 64, 64, 64


# ---------------------------------------------------------------- Mamba-2 SSD
def _segsum(la: torch.Tensor) -> torch.Tensor:
    """[..., Q] log decays -> [..., Q, Q]: sum of la over (j, i] for i >= j, -inf above."""
    q = la.shape[-1]
    cum = la.cumsum(-1)
    seg = cum[..., :, None] - cum[..., None, :]
    mask = torch.ones(q, q, dtype=torch.bool, device=la.device).tril()
    return seg.masked_fill(~mask, float("-inf"))


def ssd_chunked(x, la, b, c, chunk: int, h0=None):
    """Mamba-2 SSD: x [B, T, H, P], log decay la [B, T, H] (<= 0), b, c [B, T, G, N];
    T a multiple of ``chunk``. Returns y [B, T, H, P] and the final state [B, H, N, P]."""
    bs, t, h, p = x.shape
    g, n = b.shape[2], b.shape[3]
    nc = t // chunk
    x = x.reshape(bs, nc, chunk, h, p)
    b = b.reshape(bs, nc, chunk, g, n)
    c = c.reshape(bs, nc, chunk, g, n)
    la = la.reshape(bs, nc, chunk, h).permute(0, 3, 1, 2)           # [B, H, nc, Q]
    cum = la.cumsum(-1)
    hg = h // g                                                     # heads per group
    # within chunk: scores C B^T per group, decayed per head, times X
    scores = torch.einsum("bcign,bcjgn->bcgij", c, b)               # [B, nc, G, Q, Q]
    decay = torch.exp(_segsum(la)).permute(0, 2, 1, 3, 4)           # [B, nc, H, Q, Q]
    scores = scores.repeat_interleave(hg, dim=2) * decay
    y = torch.einsum("bchij,bcjhp->bcihp", scores, x)
    # chunk states: B^T X, each token decayed to the chunk's end
    to_end = torch.exp(cum[..., -1:] - cum).permute(0, 2, 3, 1)     # [B, nc, Q, H]
    bh = b.repeat_interleave(hg, dim=3)                             # [B, nc, Q, H, N]
    states = torch.einsum("bcjhn,bcjh,bcjhp->bchnp", bh, to_end, x)
    # state passing, chunk to chunk
    state = x.new_zeros(bs, h, n, p) if h0 is None else h0
    chunk_decay = torch.exp(cum[..., -1])                           # [B, H, nc]
    entering = []
    for i in range(nc):
        entering.append(state)
        state = chunk_decay[:, :, i, None, None] * state + states[:, i]
    prev = torch.stack(entering, dim=1)                             # [B, nc, H, N, P]
    # output from the state entering each chunk
    ch = c.repeat_interleave(hg, dim=3)
    y = y + torch.einsum("bcihn,bchnp,bhci->bcihp", ch, prev, torch.exp(cum))
    return y.reshape(bs, t, h, p), state


def ssd_step(x, la, b, c, h):
    """One token: x [B, H, P], la [B, H], b, c [B, G, N], h [B, H, N, P] (updated)."""
    hg = h.shape[1] // b.shape[1]
    bh, ch = b.repeat_interleave(hg, dim=1), c.repeat_interleave(hg, dim=1)
    h.mul_(torch.exp(la)[..., None, None]).add_(bh[..., None] * x[..., None, :])
    return torch.einsum("bhn,bhnp->bhp", ch, h)


# ---------------------------------------------------------------- gated delta rule
def delta_chunked(q, k, v, la, beta, chunk: int, s0=None):
    """Gated delta rule: q, k [B, T, H, K] (k L2-normalised), v [B, T, H, V], log decay la
    and beta [B, T, H]. Returns o [B, T, H, V] and the final state [B, H, K, V]."""
    bs, t, h, dk = k.shape
    dv, nc = v.shape[-1], t // chunk

    def chunks(z):                                                  # -> [B, H, nc, Q, ...]
        return z.reshape(bs, nc, chunk, h, *z.shape[3:]).transpose(1, 3).transpose(2, 3) \
            if z.dim() == 4 else z.reshape(bs, nc, chunk, h).permute(0, 3, 1, 2)

    q, k, v, la, beta = map(chunks, (q, k, v, la, beta))
    cum = la.cumsum(-1)                                             # [B, H, nc, Q]
    gamma = torch.exp(_segsum(la))                                  # lower incl. diagonal
    kb = k * beta[..., None]
    strict = torch.ones(chunk, chunk, dtype=torch.bool, device=k.device).tril(-1)
    a = (kb @ k.transpose(-1, -2) * gamma).masked_fill(~strict, 0.0)
    eye = torch.eye(chunk, dtype=k.dtype, device=k.device)
    tinv = torch.linalg.solve_triangular(a + eye, eye.expand_as(a), upper=False,
                                         unitriangular=True)       # T = (I + A)^-1
    u = tinv @ (v * beta[..., None])
    w = tinv @ (kb * torch.exp(cum)[..., None])
    qk = (q @ k.transpose(-1, -2)) * gamma                          # causal (gamma is 0 above)
    state = k.new_zeros(bs, h, dk, dv) if s0 is None else s0
    outs = []
    for i in range(nc):
        u_i = u[:, :, i] - w[:, :, i] @ state
        o = (q[:, :, i] * torch.exp(cum[:, :, i])[..., None]) @ state + qk[:, :, i] @ u_i
        outs.append(o)
        to_end = torch.exp(cum[:, :, i, -1:] - cum[:, :, i])[..., None]
        state = state * torch.exp(cum[:, :, i, -1])[..., None, None] \
            + (k[:, :, i] * to_end).transpose(-1, -2) @ u_i
    o = torch.stack(outs, dim=2)                                    # [B, H, nc, Q, V]
    return o.permute(0, 2, 3, 1, 4).reshape(bs, t, h, dv), state


def delta_step(q, k, v, la, beta, s):
    """One token: q, k [B, H, K], v [B, H, V], la, beta [B, H], s [B, H, K, V] (updated)."""
    s.mul_(torch.exp(la)[..., None, None])
    new = v - torch.einsum("bhk,bhkv->bhv", k, s)
    s.add_((beta[..., None] * k)[..., None] * new[..., None, :])
    return torch.einsum("bhk,bhkv->bhv", q, s)


# ---------------------------------------------------------------- inputs
def inputs(kind: str, batch: int, tokens: int, gen: torch.Generator, heads: int = HEADS,
           groups: int = GROUPS, d_k: int = D_K, d_v: int = D_V) -> dict[str, torch.Tensor]:
    """Fresh random inputs [batch, tokens, ...] of the ``ssd`` or ``delta`` layer."""
    def r(*shape):
        return torch.randn(*shape, generator=gen)

    la = -F.softplus(r(batch, tokens, heads)) * 0.1                 # decay a = exp(la) in (0, 1)
    if kind == "ssd":
        return {"x": r(batch, tokens, heads, d_v), "la": la,
                "b": r(batch, tokens, groups, d_k) / d_k ** 0.5,
                "c": r(batch, tokens, groups, d_k) / d_k ** 0.5}
    return {"q": F.normalize(r(batch, tokens, heads, d_k), dim=-1),
            "k": F.normalize(r(batch, tokens, heads, d_k), dim=-1),
            "v": r(batch, tokens, heads, d_v), "la": la,
            "beta": torch.sigmoid(r(batch, tokens, heads))}


def state_of(kind: str, batch: int, gen: torch.Generator) -> torch.Tensor:
    shape = (batch, HEADS, D_K, D_V)
    return torch.randn(*shape, generator=gen) * 0.1


def prefill_fn(kind: str, chunk: int = CHUNK):
    if kind == "ssd":
        return lambda z: ssd_chunked(z["x"], z["la"], z["b"], z["c"], chunk)
    return lambda z: delta_chunked(z["q"], z["k"], z["v"], z["la"], z["beta"], chunk)


def step_fn(kind: str):
    """f(inputs of one token [B, 1, ...], state) -> output, updating the state."""
    if kind == "ssd":
        return lambda z, s: ssd_step(z["x"][:, 0], z["la"][:, 0], z["b"][:, 0], z["c"][:, 0], s)
    return lambda z, s: delta_step(z["q"][:, 0], z["k"][:, 0], z["v"][:, 0], z["la"][:, 0],
                                   z["beta"][:, 0], s)


# ---------------------------------------------------------------- prediction
def record(kind: str, batch: int, q_len: int, kv_len: int, chunk: int = CHUNK) -> Scan:
    """The ``cost.scan`` record of the reference at fp32 (activations and state 4 bytes)."""
    cls, delta = (Scan, False) if kind == "ssd" else (LinearScan, True)
    return cls(batch=np.array([batch]), q_len=np.array([q_len]), kv_len=np.array([kv_len]),
               heads=HEADS, qk_heads=GROUPS if kind == "ssd" else HEADS, d_k=D_K, d_v=D_V,
               chunk=chunk, delta=delta, gates=1 if kind == "ssd" else 2, act_bytes=4.0,
               state_bytes=4.0, dtype=dtype_code("fp32"))


class _Count(TorchDispatchMode):
    """Counts the aten operators dispatched inside it."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def aten_ops(call) -> int:
    with _Count() as mode:
        call()
    return mode.n


# the profiler's aten operators by what the chain calls them (``scan_chain.Row.label``)
CATEGORIES = {"aten::bmm": "matmul", "aten::mm": "matmul", "aten::addmm": "matmul",
              "aten::baddbmm": "matmul", "aten::linalg_solve_triangular": "matmul",
              "aten::exp": "exp", "aten::copy_": "copy", "aten::cat": "copy"}
LABELS = ("matmul", "exp", "copy", "pass")


def profile_shares(call, calls: int = 20) -> dict[str, float]:
    """Share of the CPU time of ``call()`` (torch profiler, self time) in each of ``LABELS``:
    the matmuls and the triangular solve, exp, copies (permutes made contiguous,
    ``repeat_interleave``, out-of-place ``masked_fill``'s clone, stack), the rest."""
    from torch.profiler import ProfilerActivity, profile

    call()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            call()
    events = prof.key_averages()
    total = max(sum(e.self_cpu_time_total for e in events), 1e-9)
    return {label: sum(e.self_cpu_time_total for e in events
                       if CATEGORIES.get(e.key, "pass") == label) / total
            for label in LABELS}


PASSES = 3     # as ``runner.default_passes`` on CPU: interference only adds time
CASES = [("prefill", 1, 256), ("prefill", 1, 1024), ("prefill", 8, 1024),
         ("decode", 1, 1024), ("decode", 8, 1024)]


def rows(hw, dev, cases=CASES, budget_s: float = 0.4) -> list[dict]:
    """Measured and predicted seconds of every (layer, phase, batch, tokens) case."""
    from validate.device import wait_quiet
    from validate.timers import measure, rotation_sets

    out = []
    gen = torch.Generator().manual_seed(0)
    for kind in ("ssd", "delta"):
        for phase, batch, tokens in cases:
            q_len = tokens if phase == "prefill" else 1
            one = inputs(kind, batch, q_len, gen)
            nbytes = sum(t.numel() * 4 for t in one.values()) + batch * HEADS * D_K * D_V * 4
            n = rotation_sets(nbytes, dev.llc_bytes, max_sets=64)
            sets = [one] + [inputs(kind, batch, q_len, gen) for _ in range(n - 1)]
            if phase == "prefill":
                f = prefill_fn(kind)

                def call(i, f=f, sets=sets):
                    return f(sets[i % len(sets)])
            else:
                f, states = step_fn(kind), [state_of(kind, batch, gen) for _ in sets]

                def call(i, f=f, sets=sets, states=states):
                    return f(sets[i % len(sets)], states[i % len(sets)])
            with torch.inference_mode():
                busy = wait_quiet(dev)
                t = measure(call, dev, budget_s=budget_s)
            out.append({"layer": "mamba2-ssd" if kind == "ssd" else "gated-deltanet",
                        "phase": phase, "batch": batch, "tokens": tokens,
                        "measured_s": t.median_s, "std_s": t.std_s, "others_busy": busy,
                        **predict(record(kind, batch, q_len, tokens), hw), "call": call})
    # counted and profiled after all timing (the profiler must not disturb a measurement)
    with torch.inference_mode():
        for r in out:
            call = r.pop("call")
            r["aten_ops"] = aten_ops(lambda call=call: call(0))
            r["share"] = profile_shares(lambda call=call: call(0))
    return out


def predict(rec: Scan, hw) -> dict:
    """The record's time on ``hw`` (host timing) as the file runs it, and as one fused
    kernel; its chain's FLOPs, bytes and dispatches, and the predicted seconds of each of
    ``LABELS`` (a decode step's products of a vector with the state are its matmuls; the
    views' launches count as ``pass``)."""
    pred = op_time(rec, hw, "host")
    fused = replace(hw, efficiency=replace(hw.efficiency, scan_kernel="fused"))
    ch = chain(rec)
    flops, nbytes, dispatches = (float(np.sum(v)) for v in totals(ch))
    by = dict.fromkeys(LABELS, 0.0)
    for r, label in zip(ch.records, ch.labels, strict=True):
        by[label] += float(np.sum(op_time(r, hw, "host").time_s))
    total = float(np.sum(pred.time_s))
    by["pass"] += total - sum(by.values())
    return {"predicted_s": total, "bound": pred.bound_name(),
            "fused_s": float(np.sum(op_time(rec, fused, "host").time_s)),
            "chain_flops": flops, "chain_bytes": nbytes, "dispatches": dispatches,
            "predicted_by": by}


def main(argv: list[str] | None = None) -> None:
    from validate.device import open_device
    from validate.recurrent_report import markdown

    hw = load_hardware(HARDWARE)
    threads = int((hw.calibration or {}).get("threads", 0)) or None
    dev = open_device("cpu", threads)
    before = os.getloadavg()[0]
    passes = [rows(hw, dev) for _ in range(PASSES)]      # the fastest pass of each row
    best = [min(runs, key=lambda r: r["measured_s"]) for runs in zip(*passes, strict=True)]
    sys.stdout.write(markdown(best, hw, dev, (before, os.getloadavg()[0])))


if __name__ == "__main__":
    main()
