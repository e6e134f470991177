"""``python -m perfmodel``: the CLI without the installed console script (for a checkout on
a machine where nothing can be installed, e.g. ``PYTHONPATH=. python3 -m perfmodel ...``;
the harness commands are then ``python3 -m validate ...``)."""

from perfmodel.cli.app import main

if __name__ == "__main__":
    main()
