"""``python -m perfmodel.cli``: the same as ``python -m perfmodel``."""

from perfmodel.cli.app import main

if __name__ == "__main__":
    main()
