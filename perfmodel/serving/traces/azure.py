"""Azure LLM inference traces (Azure/AzurePublicDataset, CC-BY-4.0): 2023
(``data/AzureLLMInferenceTrace_code.csv``, ``_conv.csv``; the Splitwise paper, ISCA 2024) and
2024 (``AzureLLMInferenceTrace_code_1week.csv``, ``_conv_1week.csv``; DynamoLLM, HPCA 2025).

Columns ``TIMESTAMP`` (the invocation time, a date and time: 2023 ``2023-11-16
18:17:03.9799600``, seven fraction digits, no zone; 2024 ``2024-05-10 00:00:00.009930+00:00``
or, on a whole second, ``2024-05-12 00:00:00+00:00``, as the 2024 notebook notes),
``ContextTokens`` and ``GeneratedTokens`` (``AzureLLMInferenceDataset2023.md``, ``...2024.md``).
Arrivals are the seconds after the earliest row; a time without a zone is read as UTC. No
prefix, session or model is given.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.serving.requests import Requests
from perfmodel.serving.traces.columns import counts, csv_columns, requests_of
from perfmodel.specs.errors import SpecError

WHAT = "an Azure LLM inference trace"
TIME, INPUT, OUTPUT = "TIMESTAMP", "ContextTokens", "GeneratedTokens"
COLUMNS = (TIME, INPUT, OUTPUT)


def read(path: Path) -> tuple[Requests, list[str]]:
    """The requests of the Azure trace ``path`` and the warnings of what was changed."""
    table = csv_columns(path, WHAT, COLUMNS, texts=(TIME,))
    stamps = pd.to_datetime(table[TIME].str.strip(), format="ISO8601", utc=True,
                            errors="coerce")
    bad = stamps.isna().to_numpy()
    if bad.any():
        row = int(np.flatnonzero(bad)[0]) + 2
        raise SpecError(f"{path}: column {TIME!r}, row {row}: expected a date and time "
                        "(YYYY-MM-DD HH:MM:SS[.fraction][+HH:MM])")
    arrival = (stamps - stamps.min()).dt.total_seconds().to_numpy()
    notes: list[str] = []
    reqs = requests_of(path, arrival, counts(table, INPUT, path),
                       counts(table, OUTPUT, path), notes)
    return reqs, notes
