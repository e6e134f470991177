"""Regenerate the accuracy gate's data: the corpus sample and the figures it is held to.

    PYTHONPATH=. python reports/kernels/make_sample.py sample runs/corpus
    PYTHONPATH=. python reports/kernels/make_sample.py figures [--shared ../shared/measurements]
    PYTHONPATH=. python reports/kernels/make_sample.py tables

``sample`` draws tests/data/kernel_sample/ from a corpus (``perfmodel kernels import``):
``PER_CLASS`` rows per device x engine x error class of the files of ``PLAN``, seeded, in
the corpus's own format (so ``perfmodel kernels compare tests/data/kernel_sample --sample 0``
scores it). ``figures`` scores the sample and the shared measurement files with the shipped
hardware files and writes their medians to tests/data/accuracy_gate.yaml, then the tables:
run it after a deliberate change of the hardware files. ``tables`` writes only the tables
from that file: the full one in docs/kernels.md and the headline table in the README and
the site's home (docs/index.md), each between its markers (tests/test_accuracy_gate.py
checks they agree with the file).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import yaml

from perfmodel.kernels import gate
from perfmodel.kernels.compare import strata, usable
from perfmodel.kernels.corpus import file_name, read_file, write_frame

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "data" / "kernel_sample"
FIGURES = ROOT / "tests" / "data" / "accuracy_gate.yaml"
README = ROOT / "README.md"
DOCS = ROOT / "docs" / "kernels.md"
HOME = ROOT / "docs" / "index.md"      # the site's home quotes the README's table
SHARED = Path(os.environ.get("PERFMODEL_SHARED", ROOT.parent / "shared")) / "measurements"
SEED = 0
# (device, engine): rows per error class
PLAN = {("h100-sxm", "vllm"): 200, ("h200-sxm", "vllm"): 200, ("a100-80gb-sxm", "vllm"): 200,
        ("b200", "vllm"): 200, ("h100-sxm", "sglang"): 100, ("h100-sxm", "trtllm"): 100,
        ("b200", "sglang"): 100}


def draw(corpus: Path) -> None:
    """Write the sample files from ``corpus``."""
    rng = np.random.default_rng(SEED)
    for old in SAMPLE.glob("*.csv.gz"):
        old.unlink()
    for (device, engine), per_class in PLAN.items():
        df = read_file(corpus / file_name(device, engine))
        ok, _ = usable(df)
        df = df[ok]
        keys = strata(df)
        picked = []
        for key in sorted(set(keys)):
            index = np.flatnonzero(keys == key)
            take = min(per_class, len(index))
            picked.append(np.sort(rng.choice(index, take, replace=False)))
        part = df.iloc[np.concatenate(picked)]
        write_frame(part, SAMPLE / file_name(device, engine))
        print(f"{file_name(device, engine)}: {len(part)} rows")


def figures(shared: Path) -> None:
    """Write the figures file and the README table from the current medians."""
    sample = gate.gated(gate.sample_medians(SAMPLE))
    measured = gate.gated(gate.shared_medians(shared)) if shared.exists() else {}
    if not measured:
        raise SystemExit(f"error: --shared: {shared}: expected the shared measurement files")
    data = {"margin": {"points": gate.MARGIN_POINTS, "relative": gate.MARGIN_RELATIVE},
            "sample": sample, "shared": measured}
    head = ("# median |error| per group that tests/test_accuracy_gate.py holds the model to\n"
            "# (figure + max(1.5 points, 10% of it)); written by\n"
            "# PYTHONPATH=. python reports/kernels/make_sample.py figures\n")
    FIGURES.write_text(head + yaml.safe_dump(data, sort_keys=False, width=100))
    print(f"{FIGURES.relative_to(ROOT)}: {len(sample)} sample and {len(measured)} shared groups")
    tables()


def tables() -> None:
    """Write docs/kernels.md's gate table and the README's headline table from the figures
    file."""
    data = yaml.safe_load(FIGURES.read_text())
    for path, table, begin, end in (
            (DOCS, gate.gate_table(data), gate.BEGIN, gate.END),
            (README, gate.headline_table(data), gate.HEADLINE_BEGIN, gate.HEADLINE_END),
            (HOME, gate.headline_table(data), gate.HEADLINE_BEGIN, gate.HEADLINE_END)):
        path.write_text(gate.replace_between(path.read_text(), table, begin, end))
        print(f"{path.relative_to(ROOT)}: table written")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("sample", help="draw tests/data/kernel_sample from a corpus")
    s.add_argument("corpus", type=Path)
    f = sub.add_parser("figures", help="write tests/data/accuracy_gate.yaml and the README table")
    f.add_argument("--shared", type=Path, default=SHARED)
    sub.add_parser("tables", help="write docs/kernels.md's and the README's tables from "
                   "tests/data/accuracy_gate.yaml")
    args = parser.parse_args()
    if args.what == "sample":
        draw(args.corpus)
    elif args.what == "figures":
        figures(args.shared)
    else:
        tables()


if __name__ == "__main__":
    main()
