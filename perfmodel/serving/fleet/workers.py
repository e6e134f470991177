"""Where replicas that share no state run: here, in forked worker processes
(``workers`` > 1), or as tasks on a Dask cluster (``--cluster``: ``fleet.cluster``)."""

from __future__ import annotations

from collections.abc import Callable

from perfmodel.serving.engine_loop import Progress


def run_apart(fn: Callable, shared: tuple, jobs: list, workers: int, cluster: str | None,
              progress: Progress | None) -> list:
    """``[fn(job, shared) for job in jobs]``: here (with ``progress``), in ``workers``
    forked processes, or as tasks on the Dask ``cluster`` (``fleet.cluster``)."""
    if cluster is not None:
        from perfmodel.serving.fleet import cluster as dask

        return dask.map_apart(fn, shared, jobs, cluster, workers)
    if workers == 1 or len(jobs) == 1:
        return [fn(job, shared, progress, keep=True) for job in jobs]
    import multiprocessing as mp

    with mp.get_context("fork").Pool(min(workers, len(jobs))) as pool:
        return pool.starmap(fn, [(job, shared) for job in jobs], chunksize=1)
