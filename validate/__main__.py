"""``python -m validate``: every perfmodel command, the harness's included, for a checkout
where nothing is installed (a lent GPU machine): ``PYTHONPATH=. python3 -m validate ...``."""

from perfmodel.cli.app import app, run
from validate.cli import register

if __name__ == "__main__":
    register(app)
    run(app)
