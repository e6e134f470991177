"""Replicas that share no state, simulated on a Dask cluster (``--cluster``): past one
machine the split ``fleet.replicas.run_replicas`` makes for worker processes runs on
Dask's ``distributed`` scheduler (the optional ``fleet`` extra, ``pip install
'perfmodel[fleet]'``), not on a scheduler of our own.

What travels: what every replica shares (model, hardware, layout, dtypes, engine settings,
KV pool size) is scattered to every worker once; each task then carries only its replica's
requests, and its result comes back without the model and hardware (as from the fork
pool: ``fleet.replicas._light``); a data-parallel-attention replica travels as one
task, its ranks in lockstep. The simulation is deterministic, so a replica run on a Dask
worker gives the same arrays, bit for bit, as in one process (``tests/test_cluster.py``).

Only routers that read the request alone (round-robin, the affinity hashes) are dealt
ahead and so can run here. A load-aware router's choice at an arrival depends on every
replica's state at that instant; ``fleet.routers.lockstep`` keeps it exact by advancing all
replicas to each arrival in one process, and ``routers.check`` refuses it with ``--cluster``
(see ``fleet.routers``' docstring for why no window of synchronisation would be both exact
and faster).

``cluster``: "local" starts a ``LocalCluster`` of ``workers`` processes (one thread each)
on this machine, kept for the rest of the process (a banded run simulates three times);
an address ("tcp://host:8786", any scheme Dask takes) connects to a running scheduler,
whose workers need this version of perfmodel importable.
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from perfmodel.specs.errors import SpecError

INSTALL = "pip install 'perfmodel[fleet]'"
_LOCAL: dict = {}
LOOPBACK = "127.0.0.1"


def check(cluster: str | None) -> None:
    """A one-line error for a ``--cluster`` that is malformed or that this installation
    cannot use (Dask's ``distributed`` package absent)."""
    if cluster is None:
        return
    if not isinstance(cluster, str) or not (cluster == "local" or "://" in cluster):
        raise SpecError(f"--cluster: expected 'local' or a Dask scheduler address such as "
                        f"tcp://host:8786, got {cluster!r}")
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise SpecError(f"--cluster: needs Dask's distributed package, not installed: "
                        f"{INSTALL}") from None


def _local(workers: int) -> object:
    """The ``LocalCluster`` of ``workers`` processes and its client, started once: its
    scheduler and workers on loopback and no dashboard (``":0"`` had put Dask's dashboard
    on every interface, the one port of perfmodel's not on 127.0.0.1). The workers log
    nothing below CRITICAL: a task's exception reaches this process through ``gather``,
    and what a worker logs itself at ERROR is the shut-down race after Ctrl-C (a heartbeat
    to a scheduler already gone, with its traceback), which ``_quiet`` cannot reach in
    another process."""
    if workers not in _LOCAL:
        from distributed import Client, LocalCluster

        with _sigint_ignored():     # inherited: Ctrl-C is this process's alone to handle
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, host=LOOPBACK,
                                   dashboard_address=None, silence_logs=logging.CRITICAL)
        _LOCAL[workers] = (Client(cluster), cluster)
    return _LOCAL[workers][0]


def map_apart(fn: Callable, shared: tuple, parts: list, cluster: str,
              workers: int) -> list:
    """``[fn(part, shared=shared) for part in parts]``, each call a task on the cluster;
    ``shared`` is sent to every worker once."""
    if cluster == "local":
        return _run(_local(workers), fn, shared, parts)
    from distributed import Client

    try:
        dask = Client(cluster, timeout=10)
    except OSError as exc:
        raise SpecError(f"--cluster: no Dask scheduler answered at {cluster} ({exc})"
                        ) from None
    with dask:
        return _run(dask, fn, shared, parts)


def _run(dask: object, fn: Callable, shared: tuple, parts: list) -> list:
    [common] = dask.scatter([shared], broadcast=True, hash=False)
    futures = dask.map(fn, parts, shared=common, pure=False)
    try:
        return dask.gather(futures)
    except KeyboardInterrupt:       # Ctrl-C: the tasks cancelled, a local cluster shut down
        _quiet()
        dask.cancel(futures)
        _close()
        raise


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored while the cluster's processes start (they inherit it)."""
    import signal

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _quiet() -> None:
    """No log lines or tracebacks from Dask's shut-down after Ctrl-C ("error: aborted" is
    the one line)."""
    for name in ("distributed", "asyncio", "tornado"):
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


@atexit.register
def _close() -> None:
    for dask, local in _LOCAL.values():
        dask.close()
        local.close()
    _LOCAL.clear()
