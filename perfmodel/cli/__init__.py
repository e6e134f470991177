"""The command-line interface: typer commands, one module per group; the only place that
touches argv, stdout and files. ``app.main`` is the console entry point."""
