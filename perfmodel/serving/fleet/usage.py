"""What a fleet cost over a run, and how much of the traffic it served within the SLOs:
GPU-hours (replica-seconds held x devices per replica / 3600), US dollars at a price per
GPU-hour, and SLO attainment (the share of requests whose TTFT and TPOT both met their
SLOs; a one-token request has no TPOT), for an autoscaled fleet (``fleet.scaling``:
each replica from its launch to its stop) and a fixed one (every replica from t = 0 to
the last finish)."""

from __future__ import annotations

import numpy as np

SECONDS_PER_HOUR = 3600.0


def usage(res: object, devices: int, slo_ttft: float | None, slo_tpot: float | None,
          usd_per_gpu_hour: float | None = None) -> dict:
    """GPU-hours, cost, mean replicas held, SLO attainment and the p90 latencies of the
    run ``res`` (a ``SimResult``) on replicas of ``devices`` devices each."""
    scaled = res.info.get("autoscale")
    end = float(np.max(res.finish_s)) if len(res) else 0.0
    gpu_s = scaled.gpu_seconds if scaled is not None else \
        res.info["engines"] * devices * end
    out = {"gpu_hours": gpu_s / SECONDS_PER_HOUR,
           "mean_replicas": gpu_s / devices / end if end > 0 else 0.0,
           "usd": None if usd_per_gpu_hour is None else
           gpu_s / SECONDS_PER_HOUR * usd_per_gpu_hour,
           "slo_attainment": None if slo_ttft is None and slo_tpot is None else
           res.goodput(slo_ttft, slo_tpot) * res.duration_s / max(len(res), 1)}
    for name in ("ttft_s", "tpot_s"):
        values = getattr(res, name)
        out[f"{name[:-2]}_p90_s"] = float(np.percentile(values, 90)) if len(values) else 0.0
    return out
