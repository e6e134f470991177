"""The kernel corpus: measured kernels of many sources (aiconfigurator-core's tables, Vidur's
profiling, our harness's CSVs) in one format with their provenance (``corpus``, importers
``aiconfigurator`` and ``importer``), and the model's error over it (``compare``,
``report``). A stage beside ``compare``: it reads specs, cost and compare; nothing in specs,
cost, schedules or serving imports it. Estimates never need it (nor pyarrow, which only the
parquet import uses: ``pip install 'perfmodel[corpus]'``)."""
