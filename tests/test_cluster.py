"""Replicas simulated on a Dask cluster (``--cluster``, the ``fleet`` extra) give the same
arrays as one process; without the extra, and with a load-aware router, a one-line
refusal."""

import sys

import numpy as np
import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.serving import traffic
from perfmodel.serving.simulate import simulate
from perfmodel.specs.errors import SpecError
from perfmodel.specs.workload import Parallelism

MODEL, HW = pm.model("llama-3-8b"), pm.hardware("h100-sxm")


@pytest.mark.parametrize("processes", [False, True])
def test_a_dask_cluster_gives_the_single_process_arrays(processes):
    """Four replicas over a LocalCluster of two workers (threads, then processes: the
    results pickled back) against one process: every array equal, bit for bit."""
    distributed = pytest.importorskip("distributed")
    reqs = traffic.generate(120, rate=30, input_len=256, output_len=48,
                            length_dist="lognormal", seed=5)
    plan = Parallelism(dp=4)
    alone = simulate(MODEL, HW, reqs, plan, router="round-robin")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=processes,
                                  dashboard_address=None) as local:
        apart = simulate(MODEL, HW, reqs, plan, router="round-robin",
                         cluster=local.scheduler_address)
    for name in ("arrival_s", "scheduled_s", "first_token_s", "finish_s", "token_s",
                 "preemptions", "prefix_hit_tokens"):
        np.testing.assert_array_equal(getattr(apart, name), getattr(alone, name))
    for a, b in zip(apart.steps.__dict__.values(), alone.steps.__dict__.values(),
                    strict=True):
        np.testing.assert_array_equal(a, b)


def test_dp_attention_replicas_run_apart_the_same():
    """Two replicas of an MoE model, each two DP-attention ranks in lockstep: in two fork
    workers and on a Dask cluster, the same arrays as in one process."""
    model = pm.model("qwen3-30b-a3b")
    reqs = traffic.generate(16, rate=30, input_len=200, output_len=6,
                            length_dist="lognormal", seed=2)
    plan = Parallelism(dp=2, ep=2, attention_dp=True)
    alone = simulate(model, HW, reqs, plan)
    results = [simulate(model, HW, reqs, plan, workers=2)]
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as local:
        results.append(simulate(model, HW, reqs, plan, cluster=local.scheduler_address))
    for res in results:
        np.testing.assert_array_equal(res.first_token_s, alone.first_token_s)
        np.testing.assert_array_equal(res.token_s, alone.token_s)
        np.testing.assert_array_equal(res.steps.time_s, alone.steps.time_s)


def test_a_load_aware_router_is_refused_on_a_cluster():
    pytest.importorskip("distributed")
    reqs = traffic.generate(8, rate=4, input_len=64, output_len=8)
    with pytest.raises(SpecError, match=r"--cluster: --router least-requests .* lockstep"):
        simulate(MODEL, HW, reqs, Parallelism(dp=2), router="least-requests",
                 cluster="local")


def test_without_the_extra_the_cli_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)      # import fails
    res = CliRunner().invoke(app, ["simulate", "-m", "llama-3-8b", "--hardware", "h100-sxm",
                                   "--rate", "2", "--num-requests", "4", "--dp", "2",
                                   "--cluster", "local", "--no-progress"])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: --cluster:") and "perfmodel[fleet]" in lines[0]


def test_a_malformed_cluster_is_refused():
    reqs = traffic.generate(4, rate=1, input_len=10, output_len=2)
    with pytest.raises(SpecError, match="--cluster: expected 'local' or a Dask"):
        simulate(MODEL, HW, reqs, Parallelism(dp=2), cluster="my-laptop")


def test_the_local_cluster_listens_on_loopback_without_a_dashboard(monkeypatch):
    """``--cluster local`` starts Dask with its scheduler and workers on 127.0.0.1 and no
    dashboard (``dashboard_address=":0"`` had bound every interface; issue 33, finding 5)."""
    import types

    from perfmodel.serving.fleet import cluster

    seen = {}

    class LocalCluster:
        def __init__(self, **kwargs):
            seen.update(kwargs)

    fake = types.SimpleNamespace(LocalCluster=LocalCluster, Client=lambda c: ("client", c))
    monkeypatch.setitem(sys.modules, "distributed", fake)
    monkeypatch.setattr(cluster, "_LOCAL", {})
    assert cluster._local(3)[0] == "client"
    assert seen["host"] == "127.0.0.1" and seen["dashboard_address"] is None
    assert seen["n_workers"] == 3
