"""Schedules compose priced steps: the static request (prefill, then decode), and the
estimates built from it (one configuration, or N at once)."""
