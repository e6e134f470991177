"""Disaggregated prefill/decode from the command line (issue 35 item 2): the KV links'
prices and their contention against hand-derived goldens, ``simulate --prefill-replicas
P --decode-replicas D`` with each pool's own device, TP and engine flags, one-line errors,
and every plan's printed ``perfmodel simulate`` command reproducing its check."""

import json
import shlex

import numpy as np
import pytest
from typer.testing import CliRunner

from perfmodel.cli.app import app
from perfmodel.serving.disagg import Pool, kv_transfer_s, simulate_disaggregated
from perfmodel.serving.kv_links import link, queued, round_robin
from perfmodel.serving.planner import check as planner_check
from perfmodel.serving.requests import Requests
from perfmodel.specs import load
from perfmodel.specs.workload import Workload

MODEL, H100 = load.model("llama-3-8b"), load.hardware("h100-sxm")
KV = 32 * 2 * 8 * 128 * 2           # llama-3-8b: layers x (K, V) x KV heads x head dim x bf16
ONE = Pool(H100)
SIM = ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm", "--num-requests", "40",
       "--input-len", "1000", "--output-len", "16", "--no-progress"]


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def test_queued_transfers_from_one_instance_go_one_after_another():
    # prefills end at 1, 1, 1, 2 s; instances 0, 0, 1, 0; 0.5 s on the wire, 0.1 s transit:
    # instance 0 sends request 0 over [1, 1.5], request 1 over [1.5, 2], request 3 over
    # [2, 2.5]; instance 1 sends request 2 over [1, 1.5]; each arrives 0.1 s after
    got, wait = queued(np.array([1.0, 1.0, 1.0, 2.0]), 0.5, 0.1, np.array([0, 0, 1, 0]))
    assert got.tolist() == pytest.approx([1.6, 2.1, 1.6, 2.6])
    assert wait.tolist() == pytest.approx([0.0, 0.5, 0.0, 0.0])
    assert round_robin(np.array([0.3, 0.1, 0.2, 0.0]), 2).tolist() == [1, 1, 0, 0]


@pytest.mark.parametrize("name, fraction", [("nixl", 0.925), ("mooncake", 0.87),
                                            ("rdma", 0.934), ("network", 1.0)])
def test_each_nic_link_sends_at_its_share_of_the_nic(name, fraction):
    net = H100.interconnect                    # 50 GB/s per GPU, 2.7 us a hop
    seconds = kv_transfer_s(MODEL, ONE, ONE, np.array([1000]), Workload(), name)[0]
    assert link(name).bandwidth_fraction == fraction
    assert seconds == pytest.approx(2.7e-6 + 1000 * KV / (50e9 * fraction), rel=1e-12)
    assert net.network_bytes_per_s == 50e9 and net.network_latency_s == pytest.approx(2.7e-6)
    nvlink = kv_transfer_s(MODEL, ONE, ONE, np.array([1000]), Workload(), "nvlink")[0]
    assert nvlink == pytest.approx(0.6e-6 + 1000 * KV / 450e9, rel=1e-12)


def test_three_prefills_ending_together_queue_their_kv_on_one_instance():
    # three 1000-token prompts at t=0 fit one 8192-token prefill step and end together;
    # their KV leaves the one prefill instance one after another: queued 0, w, 2w with
    # w = 1000 x 131072 B / (92.5% of 50 GB/s) = 2.8339 ms (nixl)
    reqs = Requests.of([0.0, 0.0, 0.0], [1000] * 3, [4] * 3)
    wire = 1000 * KV / (0.925 * 50e9)
    off = simulate_disaggregated(MODEL, reqs, ONE, ONE, "nixl")
    on = simulate_disaggregated(MODEL, reqs, ONE, ONE, "nixl", contention=True)
    assert np.ptp(on.info["prefill"].finish_s) == 0.0
    assert on.info["kv_queued_s"].tolist() == pytest.approx([0.0, wire, 2 * wire], rel=1e-9)
    assert off.info["kv_queued_s"].tolist() == [0.0, 0.0, 0.0]
    assert np.diff(on.info["kv_ready_s"]).tolist() == pytest.approx([wire, wire], rel=1e-9)
    # the first is alone on the decode side sooner (a one-sequence step), the others later
    assert np.all(on.ttft_s[1:] > off.ttft_s[1:] + wire)


def test_simulate_two_pools_each_with_its_own_device_tp_and_flags():
    r = _cli(*SIM, "--rate", "10", "--prefill-replicas", "1", "--decode-replicas", "2",
             "--prefill-hardware", "h200-sxm", "--decode-tp", "2",
             "--prefill-flag", "max-num-batched-tokens=2048", "--decode-flag",
             "max-num-seqs=16", "--kv-link", "mooncake", "-f", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)["disaggregated"]
    assert d["prefill_pool"] == "1 x h200-sxm" and d["decode_pool"] == "2 x h100-sxm TP2"
    assert d["gpus"] == 5 and d["link"].startswith("mooncake") and "87.0% of 50 GB/s" in \
        d["link"] and "FAST'25" in d["link_source"] and d["contention"] is True
    assert "--max-num-batched-tokens 2048" in d["prefill_engine"]
    assert "--max-num-seqs 256" in d["prefill_engine"]
    assert "--max-num-seqs 16" in d["decode_engine"]
    assert "--max-num-batched-tokens 8192" in d["decode_engine"]
    text = _cli(*SIM, "--rate", "10", "--prefill-replicas", "1")
    assert text.exit_code == 0, text.output
    for words in ("disaggregated: 1 x h100-sxm prefill + 1 x h100-sxm decode (2 GPUs)",
                  "KV transfer: nixl (pools on different nodes)", "queued for the NICs"):
        assert words in text.stdout, words


def test_two_rates_and_the_out_folder(tmp_path):
    r = _cli(*SIM, "--rate", "10,5", "--prefill-replicas", "1", "--out", str(tmp_path / "o"),
             "--dpi", "20")
    assert r.exit_code == 0, r.output
    assert "offered" in r.stdout                 # the load table of the two rates
    summary = json.loads((tmp_path / "o" / "summary-1.json").read_text())
    assert summary["disaggregated"]["decode_pool"] == "1 x h100-sxm"
    assert summary["n_requests"] == 40 and (tmp_path / "o" / "requests-0.csv").is_file()


def test_contention_makes_the_kv_wait_under_a_burst():
    burst = [*SIM, "--rate", "inf", "--prefill-replicas", "1", "-f", "json"]
    on, off = _cli(*burst), _cli(*burst, "--no-kv-contention")
    assert on.exit_code == 0 and off.exit_code == 0, on.output + off.output
    on, off = json.loads(on.stdout), json.loads(off.stdout)
    assert on["disaggregated"]["kv_queued_s"]["max"] > 0
    assert off["disaggregated"]["kv_queued_s"]["max"] == 0
    assert on["ttft_s"]["mean"] > off["ttft_s"]["mean"]


@pytest.mark.parametrize("args, words", [
    (["--decode-tp", "2"], "--decode-tp: applies to a disaggregated deployment"),
    (["--kv-link", "nvlink"], "--kv-link: applies to a disaggregated deployment"),
    (["--prefill-replicas", "1", "--prefill-flag", "max-num-seqs"],
     "--prefill-flag max-num-seqs: expected NAME=VALUE"),
    (["--prefill-replicas", "1", "--decode-flag", "page-size=8"],
     "--decode-flag page-size=8: page-size is not an engine flag of --engine vllm"),
    (["--prefill-replicas", "1", "--prefill-flag", "max-num-seqs=many"],
     "--prefill-flag max-num-seqs=many: 'many' is not a valid int"),
    (["--prefill-replicas", "1", "--decode-flag", "max-num-seqs=0"],
     "--decode-flag max-num-seqs=0: 0 is not in the range x>=1"),
    (["--prefill-replicas", "1", "--kv-link", "pcie"], "link must be one of nixl"),
    (["--prefill-replicas", "1", "--dp", "2"], "--dp: not with --prefill-replicas"),
    (["--prefill-replicas", "1", "--kv-link", "nvlink", "--decode-hardware", "h200-sxm"],
     "link 'nvlink' joins devices of one node, got h100-sxm and h200-sxm"),
    (["--prefill-replicas", "5", "--decode-replicas", "4", "--kv-link", "nvlink"],
     "5 + 4 GPUs exceed its 8"),
])
def test_bad_input_is_one_line(args, words):
    r = _cli(*SIM, "--rate", "10", *args)
    assert r.exit_code == 2, r.output
    assert words in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_concurrency_is_refused_in_one_line():
    r = _cli(*SIM[:-5], "--concurrency", "4", "--prefill-replicas", "1")
    assert r.exit_code == 2 and r.output.startswith("error: --concurrency: not with "
                                                    "--prefill-replicas"), r.output


PLANS = {   # the golden cases' plans (tests/test_serving_golden.py): one of each kind, and
    # the disaggregated one on SGLang (its batch ceiling is --max-running-requests)
    "disaggregated": ("vllm", "llama-3-70b", "--slo-ttft", "2", "--slo-tpot", "0.03",
                      "--rate", "10", "--input-len", "4096", "--output-len", "256"),
    "disaggregated-sglang": ("sglang", "llama-3-70b", "--slo-ttft", "2", "--slo-tpot", "0.03",
                             "--rate", "10", "--input-len", "4096", "--output-len", "256"),
    "aggregated": ("vllm", "llama-3.1-8b", "--slo-ttft", "0.5", "--slo-tpot", "0.05",
                   "--rate", "20", "--input-len", "512", "--output-len", "64"),
}


@pytest.mark.parametrize("case", sorted(PLANS))
def test_the_plans_printed_simulate_command_reproduces_its_check(case, monkeypatch):
    """Issue 35 item 2's must-show: the printed command, run as a user runs it, gives the
    check's TTFT, TPOT, ITL, E2E, throughput and goodput (the whole run's, to the last
    digit)."""
    runs, real = {}, planner_check.simulated

    def kept(*args):                     # each check's own run, by candidate
        runs[args[4]] = real(*args)
        return runs[args[4]]

    monkeypatch.setattr(planner_check, "simulated", kept)
    engine, name, *ask = PLANS[case]
    r = _cli("plan", "--no-progress", "-m", name, "-H", "h100-sxm", "--engine", engine,
             *ask, "--requests", "100", "-f", "json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    w, cmd = report["winner"], shlex.split(report["simulate_command"])
    assert (report["plan"]["prefill_dp"] > 0) == case.startswith("disaggregated")
    assert cmd[:2] == ["perfmodel", "simulate"]
    assert ("--prefill-replicas" in cmd) == case.startswith("disaggregated")
    assert (f"--engine {engine}" in report["simulate_command"]) == (engine != "vllm")
    sim = _cli(*cmd[1:], "-f", "json", "--no-progress")
    assert sim.exit_code == 0, sim.output
    got = json.loads(sim.stdout)
    assert got["n_requests"] == w["requests"]
    assert got["ttft_s"]["p90"] == pytest.approx(w["whole_run_ttft_p90_s"], rel=1e-12)
    assert got["tpot_s"]["p90"] == pytest.approx(w["whole_run_tpot_p90_s"], rel=1e-12)
    want = runs[w["index"]].summary(float(ask[1]), float(ask[3]))   # the SLOs
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):      # every statistic printed
        centre = {k: v for k, v in got[key].items() if not k.endswith(("_low", "_high"))}
        assert centre == pytest.approx(want[key], rel=1e-12), key
    for key in ("throughput_tokens_per_s", "requests_per_s", "goodput_requests_per_s"):
        assert got[key] == pytest.approx(want[key], rel=1e-12), key
