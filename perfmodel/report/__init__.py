"""Reports: text tables, JSON and CSV of estimates (``tables``), markdown/HTML documents
(``pages``) and figures (``plots``, ``sweep_plots``). Pure: they return text and figures;
the CLI writes the files."""
