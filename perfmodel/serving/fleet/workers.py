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

    # the workers leave Ctrl-C to this process (a SIGINT reaches the whole process group:
    # each worker printed its own traceback); the wait here takes it within 0.2 s, and
    # leaving the block terminates the workers
    with mp.get_context("fork").Pool(min(workers, len(jobs)), initializer=_ignore_sigint
                                      ) as pool:
        result = pool.starmap_async(fn, [(job, shared) for job in jobs], chunksize=1)
        while not result.ready():
            result.wait(0.2)
        return result.get()


def _ignore_sigint() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
