"""The deployment planner: its steady-state formulas, the candidate search, the ranking
confirmed by simulation, and the ``plan`` command's output and one-line errors."""

import numpy as np
import pytest

from perfmodel.serving import planner
from perfmodel.serving.planner import Target, pareto_mask, steady_state
from perfmodel.specs import load
from perfmodel.specs.errors import SpecError

H100, A100 = load.hardware("h100-sxm"), load.hardware("a100-80gb-sxm")
SMALL = load.model("llama-3-8b")


def _state(prefill_dp: int, shares: list[float], transfer: float = 0.0) -> dict:
    one = np.array([1.0])
    # TPOT aggregated = batch / static throughput = 32 / (32 / 0.03) = 30 ms
    return steady_state(0.1 * one, 0.02 * one, one * 32 / 0.03, one * 32, 100.0,
                        one * prefill_dp, one * 2, one * transfer, np.array([shares]))


def test_aggregated_steady_state():
    st = _state(0, [1e-6, 0.5, 0.9, 1.0])
    assert st["tpot_s"][0] == pytest.approx(0.03)
    assert st["capacity_req_s"][0] == pytest.approx(2 * 32 / (100 * 0.03))
    ttft = st["ttft_p90_s"][0]
    assert ttft[0] == pytest.approx(0.1 + 0.02, rel=1e-3)   # no queue at no load
    assert ttft[0] < ttft[1] < ttft[2] and np.isinf(ttft[3])


def test_disaggregated_steady_state():
    st = _state(1, [1e-6, 0.9], transfer=0.01)
    assert st["tpot_s"][0] == pytest.approx(0.02)            # no prompt in the decode steps
    assert st["capacity_req_s"][0] == pytest.approx(10.0)    # one prefill replica, 0.1 s each
    assert st["ttft_p90_s"][0, 0] == pytest.approx(0.13, rel=1e-3)
    # at 90% the one prefill server queues: M/D/1, p90 = m ln(10 rho), m = s / (2 (1 - rho));
    # the decode pool's 64 slots at 28% load wait for nothing
    m = 0.5 * 0.1 / 0.1
    assert st["ttft_p90_s"][0, 1] == pytest.approx(0.13 + m * np.log(9))


def test_queue_wait_p90():
    rho = np.array([0.5, 0.9])
    assert planner._wait_p90(rho, 1, np.ones(2)) == pytest.approx(
        0.5 / (1 - rho) * np.log(10 * rho))                  # M/D/1: Erlang C = rho
    many = planner._wait_p90(np.array([0.5]), np.array([64]), np.array([10.0]))
    assert many[0] == 0.0                                    # 64 slots half busy: no wait


def test_pareto_mask():
    x = np.array([1.0, 2.0, 3.0, 2.0, 1.0])
    y = np.array([5.0, 4.0, 1.0, 3.0, 5.0])
    assert pareto_mask(x, y).tolist() == [True, True, True, False, True]


def test_replica_plans_and_weights():
    assert [p.tp for p in planner.replica_plans(SMALL, H100, 8)] == [1, 2, 4, 8]
    assert [p.tp for p in planner.replica_plans(SMALL, load.hardware("h100-nvl"), 8)] == [1, 2]
    moe = planner.replica_plans(load.model("qwen3-30b-a3b"), H100, 4)
    assert [(p.tp, p.ep, p.attention_dp) for p in moe] == [
        (1, 1, False), (2, 2, False), (4, 4, False), (1, 2, True), (1, 4, True)]
    assert [w.weights_dtype for w in planner.weight_choices(SMALL, H100)] == ["bf16", "fp8"]
    assert [w.weights_dtype for w in planner.weight_choices(SMALL, A100)] == ["bf16"]


def test_replica_times_cap_batches_at_the_kv_ceiling():
    big = load.model("llama-3-70b")
    target = Target(8, 2.0, 0.05, 2048, 256)
    times = planner.replica_times(big, H100, planner.Parallelism(tp=2), target)
    bf16 = times["weights_dtype"] == "bf16"
    assert times["batch"][bf16].tolist() == [7]              # bf16 TP2: room for 7 sequences
    assert times["batch"][~bf16].max() == times["kv_max_batch"][~bf16][0]
    assert np.all(np.diff(times["step_s"][~bf16]) > 0)
    assert not len(planner.replica_times(big, A100, planner.Parallelism(), target)["batch"])


def test_candidates_split_over_nvlink_in_a_node_and_the_network_beyond():
    cols = planner.candidates(SMALL, [H100], Target(16, 2.0, 0.05, 1000, 100))
    split = cols["prefill_replicas"] > 0
    assert set(cols["link"][split & (cols["tp"] == 8)]) == {"network"}
    assert np.all(cols["gpus"] <= 16) and split.any() and (~split).any()
    assert np.all(cols["transfer_s"][split] > 0) and np.all(cols["transfer_s"][~split] == 0)
    inside = planner.candidates(SMALL, [H100], Target(4, 2.0, 0.05, 1000, 100))
    assert set(inside["link"][inside["prefill_replicas"] > 0]) == {"nvlink"}


def test_plan_ranks_confirms_and_picks():
    target = Target(2, 1.0, 0.03, 1000, 100)
    result = planner.plan(SMALL, [H100, A100], target, n_requests=60)
    cols = result.candidates
    assert 1 <= len(result.confirmed) <= planner.CONFIRM
    assert len({c["label"].rsplit(" B", 1)[0] for c in result.confirmed}) == \
        len(result.confirmed)                                # distinct deployments
    w = result.winner
    assert w["confirmed"] and w["meets_slos"] and cols["feasible"][w["index"]]
    assert w["simulated_ttft_p90_s"] <= 1.0 and w["simulated_tpot_p90_s"] <= 0.03
    ranked = planner.ranking(cols, target)
    assert cols["throughput_per_gpu"][ranked[0]] == cols["throughput_per_gpu"][cols[
        "feasible"]].max()
    records = result.records()
    assert len(records) == len(cols["label"]) and any(r["pareto"] for r in records)
    assert isinstance(records[0]["throughput_per_gpu"], float)


def test_a_rate_must_fit_under_the_slo_bound_load():
    easy = planner.evaluate(planner.candidates(SMALL, [H100], Target(2, 1.0, 0.05, 1000, 100)),
                            Target(2, 1.0, 0.05, 1000, 100))
    top = easy["slo_rate_req_s"].max()
    hard = Target(2, 1.0, 0.05, 1000, 100, rate=top * 1.01)
    cols = planner.evaluate(planner.candidates(SMALL, [H100], hard), hard)
    assert not cols["meets_ttft"].any()
    assert np.all(cols["rate_req_s"] == hard.rate)


@pytest.mark.parametrize(("kwargs", "flag"), [
    ({"slo_ttft_s": 0.0}, "--slo-ttft"), ({"slo_tpot_s": -1.0}, "--slo-tpot"),
    ({"gpus": 0}, "--gpus"), ({"input_len": 0}, "--input-len")])
def test_bad_targets_name_the_option(kwargs, flag):
    args = {"gpus": 8, "slo_ttft_s": 2.0, "slo_tpot_s": 0.05, "input_len": 100,
            "output_len": 10} | kwargs
    with pytest.raises(SpecError, match=flag):
        Target(**args)


def test_a_model_that_fits_nowhere():
    with pytest.raises(SpecError, match=r"fits on none of l4 \(-H\) within --gpus 1"):
        planner.plan(load.model("llama-3-70b"), [load.hardware("l4")],
                     Target(1, 2.0, 0.05, 100, 10))
    with pytest.raises(SpecError, match="context limit"):
        planner.plan(SMALL, [H100], Target(1, 2.0, 0.05, 8000, 1000))


# --- the plan command ----------------------------------------------------------------

def _cli():
    import typer

    from perfmodel.cli.app import OneLineErrors
    from perfmodel.cli.plan import plan_cmd

    cli = typer.Typer(cls=OneLineErrors, add_completion=False, pretty_exceptions_enable=False,
                      rich_markup_mode=None)
    cli.callback()(lambda: None)
    cli.command("plan")(plan_cmd)
    return cli


def _run(*args: str):
    from typer.testing import CliRunner

    return CliRunner().invoke(_cli(), ["plan", *args])


ASK = ("-m", "llama-3-8b", "-H", "h100-sxm,a100-80gb-sxm", "--gpus", "2", "--slo-ttft", "1",
       "--slo-tpot", "0.03", "--requests", "60")


def test_plan_command_explains_and_gives_launch_lines():
    r = _run(*ASK, "--input-len", "1000", "--output-len", "100")
    assert r.exit_code == 0, r.output
    for text in ("chosen:", "met both SLOs in simulation", "why:", "parallelism (best", "batch ",
                 "vllm serve meta-llama/Meta-Llama-3-8B", "--max-num-seqs",
                 "python -m sglang.launch_server", "--max-running-requests", "pipeline",
                 "planned in"):
        assert text in r.stdout


def test_plan_command_json_and_files(tmp_path):
    import json

    r = _run(*ASK, "--input-len", "1000", "--output-len", "100", "-f", "json",
             "--out", str(tmp_path / "p"))
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout.split("\nwrote ")[0])
    assert data["winner"]["confirmed"] and "vllm serve" in data["commands"]["vLLM"]
    assert data["launch"]["vllm"]["version"] and data["launch"]["sglang"]["steps"]
    assert data["feasible"] <= data["candidates"] and data["pareto"]
    head = (tmp_path / "p" / "plan.csv").read_text().splitlines()[0].split(",")
    assert {"throughput_per_gpu", "tokens_per_s_per_user", "pareto", "feasible"} <= set(head)
    assert (tmp_path / "p" / "pareto.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "p" / "plan.json").read_text())["model"] == "llama-3-8b"


def test_plan_command_from_a_trace(tmp_path):
    from perfmodel.serving import traffic

    path = tmp_path / "t.csv"
    traffic.write_trace(traffic.generate(80, rate=4.0, input_len=800, output_len=80, seed=1),
                        path)
    r = _run(*ASK, "--trace", str(path))
    assert r.exit_code == 0, r.output
    assert "4.00 req/s" in r.stdout and "the trace's 4.00 req/s" in r.stdout
    both = _run(*ASK, "--trace", str(path), "--input-len", "5")
    assert both.exit_code == 2 and "--input-len" in both.stderr


@pytest.mark.parametrize(("change", "flag"), [
    (("--slo-ttft", "0"), "--slo-ttft"), (("--slo-tpot", "-0.1"), "--slo-tpot"),
    (("--gpus", "0"), "--gpus"), (("-H", "h100-sxmm"), "--hardware"),
    (("-m", "llama-3.1-405b", "-H", "l4", "--gpus", "1"), "fits on none"),
    ((), "--input-len")])
def test_plan_command_bad_input_is_one_line(change, flag):
    args = list(ASK)
    for key, value in zip(change[::2], change[1::2], strict=True):
        args[args.index(key) + 1] = value
    lengths = () if flag == "--input-len" else ("--input-len", "100", "--output-len", "10")
    r = _run(*args, *lengths)
    assert r.exit_code == 2
    assert r.stderr.startswith("error: ") and flag in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_launch_lines_of_moe_and_split_deployments():
    from types import SimpleNamespace

    from perfmodel.cli.plan import commands

    def cols(**over):
        base = {"tp": [1], "ep": [4], "attention_dp": [True], "prefill_replicas": [0],
                "decode_replicas": [2], "batch": [128], "weights_dtype": ["fp8"]}
        return {k: np.array(v) for k, v in (base | over).items()}

    moe = SimpleNamespace(model=load.model("qwen3-30b-a3b"), winner={"index": 0},
                          candidates=cols())
    out = commands(moe)        # EP4 with data-parallel attention: TP1 x DP4 in one server
    assert "vllm serve Qwen/Qwen3-30B-A3B --tensor-parallel-size 1 --data-parallel-size 4 " \
           "--enable-expert-parallel --quantization fp8 --max-num-seqs 32" in out["vLLM"]
    assert "--tp-size 4 --dp-size 4 --enable-dp-attention --ep-size 4" in out["SGLang"]
    assert out["vLLM"].count("vllm serve") == 2 and "load balancer" in out["vLLM"]
    split = SimpleNamespace(model=SMALL, winner={"index": 0}, candidates=cols(
        tp=[2], ep=[1], attention_dp=[False], prefill_replicas=[1], decode_replicas=[3],
        weights_dtype=["bf16"]))
    out = commands(split)
    assert out["vLLM"].count("NixlConnector") == 4 and "--quantization" not in out["vLLM"]
    assert out["vLLM"].count("prefill server on GPUs") == 1
    assert out["vLLM"].count("decode server on GPUs") == 3
    assert "--disaggregation-mode prefill" in out["SGLang"]
    assert "--max-running-requests 128 --chunked-prefill-size 8192 --disaggregation-mode " \
           "decode --disaggregation-transfer-backend nixl" in out["SGLang"]


def test_the_brief_example_answers_in_under_ten_seconds():
    import time

    start = time.perf_counter()
    r = _run("-m", "llama-3-70b", "-H", "h100-sxm,a100-80gb-sxm", "--gpus", "8",
             "--input-len", "2048", "--output-len", "256", "--slo-ttft", "2",
             "--slo-tpot", "0.05")
    assert r.exit_code == 0, r.output
    assert time.perf_counter() - start < 10
    assert "chosen: h100-sxm" in r.stdout


def test_when_no_candidate_meets_the_slos_the_nearest_is_shown():
    result = planner.plan(SMALL, [H100], Target(1, 0.001, 0.001, 500, 50), n_requests=40)
    assert not result.candidates["feasible"].any()
    assert not result.winner["confirmed"] and not result.winner["meets_slos"]
    assert all(planner.SIM_LEAST <= c["requests"] <= 40 for c in result.confirmed)


def test_splits_a_model_cannot_take_are_skipped():
    cols = planner.candidates(load.model("falcon-7b"), [H100], Target(4, 2.0, 0.05, 500, 50))
    assert set(cols["tp"].tolist()) == {1}                   # 71 heads: no TP 2 or 4


# --- prices: the hardware YAML's price: block, tokens per dollar, --rank cost ------------

PRICES = {"h100-sxm": 10.0, "a100-80gb-sxm": 1.0}     # USD per GPU-hour, made up for the test


def _priced(tmp_path, name: str, block: str) -> str:
    """A copy of the shipped ``name``.yaml with ``block`` appended at the top level."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(load.HARDWARE_DIR.joinpath(f"{name}.yaml").read_text() + block)
    return str(path)


def _price_block(usd: object, extra: str = "") -> str:
    return f"price:\n  usd_per_hour: {usd}\n  source: \"made up for a test\"\n{extra}"


def test_shipped_files_carry_no_price():
    assert all(load.hardware(n).price_per_hour is None for n in load.shipped(load.HARDWARE_DIR))


def test_a_price_block_gives_price_per_hour(tmp_path):
    hw = load.hardware(_priced(tmp_path, "h100-sxm", _price_block(2.99)))
    assert hw.price_per_hour == 2.99 and hw.sources["price"] == "made up for a test"
    assert hw.peak("bf16") == H100.peak("bf16")


@pytest.mark.parametrize(("block", "what"), [
    (_price_block(-2.5), "positive"), (_price_block(".nan"), "finite"),
    (_price_block('"$2.99"'), "number of US dollars"), (_price_block('"2.99"'), "US dollars"),
    (_price_block(5000), "at most 1000"), (_price_block(2.0, "  currency: EUR\n"), "unknown"),
    ("price:\n  usd_per_hour: 2.0\n", "missing"), ("price: 2.99\n", "mapping")])
def test_bad_prices_are_one_line_errors_naming_file_and_field(tmp_path, block, what):
    path = _priced(tmp_path, "h100-sxm", block)
    with pytest.raises(SpecError) as err:
        load.hardware(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: price") and what in msg and "\n" not in msg
    field = "source" if what == "missing" else "currency" if what == "unknown" else \
        "price" if what == "mapping" else "usd_per_hour"
    assert field in msg


def _two_priced(tmp_path) -> list:
    return [load.hardware(_priced(tmp_path, n, _price_block(usd))) for n, usd in PRICES.items()]


def test_cost_ranking_picks_the_cheaper_per_token_device(tmp_path):
    from perfmodel.serving.dollars import priced

    target = Target(2, 1.0, 0.03, 1000, 100)
    devices = _two_priced(tmp_path)
    cols = planner.evaluate(planner.candidates(SMALL, devices, target), target)
    cols, note = priced(cols, devices, "gpu")
    ok = cols["feasible"]
    best = {n: cols["throughput_per_gpu"][ok & (cols["hardware"] == n)].max() for n in PRICES}
    # by hand: tokens per dollar = tok/s per GPU x 3600 s / USD per GPU-hour
    per_dollar = {n: best[n] * 3600 / PRICES[n] for n in PRICES}
    assert best["h100-sxm"] > best["a100-80gb-sxm"]          # faster per GPU ...
    assert per_dollar["a100-80gb-sxm"] > per_dollar["h100-sxm"]   # ... dearer per token
    by_gpu, by_cost = (planner.ranking(cols, target, r) for r in ("gpu", "cost"))
    assert cols["hardware"][by_gpu[0]] == "h100-sxm"
    assert cols["hardware"][by_cost[0]] == "a100-80gb-sxm"
    assert cols["tokens_per_dollar"][by_cost[0]] == pytest.approx(per_dollar["a100-80gb-sxm"])
    assert "ranked by throughput per GPU" in note
    won = planner.plan(SMALL, devices, target, n_requests=60, rank="cost")
    assert won.winner["label"].startswith("a100-80gb-sxm") and won.rank == "cost"
    assert won.winner["estimated_tokens_per_dollar"] == pytest.approx(
        won.candidates["tokens_per_dollar"][won.winner["index"]])
    assert any("ranked by output tokens per dollar" in n for n in won.notes)


def test_some_devices_priced_ranks_per_gpu_and_says_so(tmp_path):
    target = Target(2, 1.0, 0.03, 1000, 100)
    mixed = [load.hardware(_priced(tmp_path, "h100-sxm", _price_block(2.0))), A100]
    result = planner.plan(SMALL, mixed, target, n_requests=60)
    assert "tokens_per_dollar" not in result.candidates
    assert any("a100-80gb-sxm has no price while h100-sxm has one" in n for n in result.notes)
    with pytest.raises(SpecError, match="--rank cost: no price for a100-80gb-sxm"):
        planner.plan(SMALL, mixed, target, n_requests=60, rank="cost")
    assert any("no hardware file has a price" in n for n in planner.plan(
        SMALL, [H100], target, n_requests=40).notes)


def test_plan_command_ranks_per_dollar(tmp_path):
    import json

    paths = ",".join(_priced(tmp_path, n, _price_block(usd)) for n, usd in PRICES.items())
    ask = ["-m", "llama-3-8b", "-H", paths, "--gpus", "2", "--slo-ttft", "1", "--slo-tpot",
           "0.03", "--requests", "60", "--input-len", "1000", "--output-len", "100"]
    by_gpu = _run(*ask)
    assert by_gpu.exit_code == 0, by_gpu.output
    assert "chosen: h100-sxm" in by_gpu.stdout and "tok/$" in by_gpu.stdout
    assert "ranked by throughput per GPU (--rank cost" in by_gpu.stdout
    r = _run(*ask, "--rank", "cost", "-f", "json", "--out", str(tmp_path / "p"))
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout.split("\nwrote ")[0])
    assert data["ranked_by"] == "cost" and data["winner"]["label"].startswith("a100-80gb-sxm")
    assert data["first_by"]["gpu"].startswith("h100-sxm")
    assert data["first_by"]["cost"].startswith("a100-80gb-sxm")
    assert any("per dollar" in line for line in data["reasons"])
    head = (tmp_path / "p" / "plan.csv").read_text().splitlines()[0].split(",")
    assert {"tokens_per_dollar", "usd_per_gpu_hour"} <= set(head)
    unpriced = _run(*ASK, "--input-len", "1000", "--output-len", "100", "--rank", "cost")
    assert unpriced.exit_code == 2 and unpriced.stderr.startswith("error: --rank cost")
    assert len(unpriced.stderr.strip().splitlines()) == 1
