"""Cost in the planner: the hardware YAML's price: block, a prices YAML (--prices), the
cost columns and --objective cost."""

import json
from pathlib import Path

import pytest

from perfmodel.serving.planner import plans as planner
from perfmodel.serving.planner.plans import Target
from perfmodel.serving.planner.prices import priced, read_prices
from perfmodel.specs import load
from perfmodel.specs.errors import SpecError

SMALL = load.model("llama-3-8b")
PRICES = {"h100-sxm": 10.0, "a100-80gb-sxm": 1.0}     # USD per GPU-hour, made up for the test


def _priced(tmp_path, name: str, block: str) -> str:
    """A copy of the shipped ``name``.yaml with ``block`` appended at the top level."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(load.HARDWARE_DIR.joinpath(f"{name}.yaml").read_text() + block)
    return str(path)


def _price_block(usd: object, extra: str = "") -> str:
    return f"price:\n  usd_per_hour: {usd}\n  source: \"made up for a test\"\n{extra}"


def _prices_file(tmp_path, table: dict, source: str = "made up") -> str:
    path = tmp_path / "prices.yaml"
    path.write_text(f"source: {source}\nusd_per_gpu_hour:\n"
                    + "".join(f"  {k}: {v}\n" for k, v in table.items()))
    return str(path)


def test_shipped_files_carry_no_price_and_the_example_prices_read():
    assert all(load.hardware(n).price_per_hour is None for n in load.shipped(load.HARDWARE_DIR))
    example = read_prices(Path(__file__).resolve().parents[1] / "docs" / "prices.example.yaml")
    assert example["h100-sxm"] == 2.69 and set(example) <= set(load.shipped(load.HARDWARE_DIR))


def test_a_price_block_gives_price_per_hour(tmp_path):
    hw = load.hardware(_priced(tmp_path, "h100-sxm", _price_block(2.99)))
    assert hw.price_per_hour == 2.99 and hw.sources["price"] == "made up for a test"


@pytest.mark.parametrize(("block", "what"), [
    (_price_block(-2.5), "positive"), (_price_block('"$2.99"'), "number of US dollars"),
    (_price_block(5000), "at most 1000"), (_price_block(2.0, "  currency: EUR\n"), "unknown"),
    ("price:\n  usd_per_hour: 2.0\n", "missing")])
def test_bad_price_blocks_are_one_line_errors(tmp_path, block, what):
    path = _priced(tmp_path, "h100-sxm", block)
    with pytest.raises(SpecError) as err:
        load.hardware(path)
    assert str(err.value).startswith(f"{path}: price") and what in str(err.value)


@pytest.mark.parametrize(("body", "what"), [
    ("usd_per_gpu_hour:\n  h100-sxm: 2\n", "source"),
    ("source: x\nusd_per_gpu_hour:\n  h100-sxm: -1\n", "usd_per_gpu_hour.h100-sxm"),
    ("source: x\nusd_per_gpu_hour:\n  h100-sxm: \"$2\"\n", "usd_per_gpu_hour.h100-sxm"),
    ("source: x\nprice: 2\n", "price")])
def test_bad_prices_files_name_file_and_field(tmp_path, body, what):
    path = tmp_path / "p.yaml"
    path.write_text(body)
    with pytest.raises(SpecError) as err:
        read_prices(path)
    assert str(err.value).startswith(f"{path}: ") and what in str(err.value)
    assert "\n" not in str(err.value)


def test_cost_objective_picks_the_cheaper_deployment(tmp_path):
    devices = [load.hardware(n) for n in PRICES]
    target = Target(4, 1.0, 0.03, 1000, 100, rate=10.0)
    cols, _ = planner.candidates(SMALL, devices, target)
    cols, note = priced(planner.evaluate(cols, target), devices, "cost", PRICES)
    ok = cols["feasible"]
    # by hand: USD per hour = GPUs x USD per GPU-hour
    assert cols["usd_per_hour"] == pytest.approx(
        cols["gpus"] * [PRICES[h] for h in cols["hardware"]])
    by_cost = planner.ranking(cols, target, "cost")
    assert cols["usd_per_hour"][by_cost[0]] == cols["usd_per_hour"][ok].min()
    assert cols["hardware"][by_cost[0]] == "a100-80gb-sxm"
    assert "lowest cost per hour" in note and "--prices" in note
    with pytest.raises(SpecError, match="--objective cost: no price for a100-80gb-sxm"):
        priced(cols, devices, "cost", {"h100-sxm": 2.0})


def test_plan_command_with_prices(tmp_path):
    from typer.testing import CliRunner

    from tests.test_plan_cli import _cli

    ask = ["plan", "-m", "llama-3-8b", "-H", "h100-sxm,a100-80gb-sxm", "--rate", "10",
           "--gpus", "4", "--slo-ttft", "1", "--slo-tpot", "0.03", "--requests", "100",
           "--input-len", "1000", "--output-len", "100"]
    prices = _prices_file(tmp_path, PRICES)
    r = CliRunner().invoke(_cli(), [*ask, "--objective", "cost", "--prices", prices, "-f",
                                    "json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["objective"] == "cost" and data["plan"]["hardware"] == "a100-80gb-sxm"
    assert data["first_by"]["gpus"] and data["first_by"]["cost"].startswith("a100-80gb-sxm")
    text = CliRunner().invoke(_cli(), [*ask, "--prices", prices])
    assert "$/hour" in text.stdout and "Pareto front (cost against TPOT" in text.stdout
    unpriced = CliRunner().invoke(_cli(), [*ask, "--objective", "cost"])
    assert unpriced.exit_code == 2 and unpriced.stderr.startswith("error: --objective cost")
