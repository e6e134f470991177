"""``perfmodel ui``: explore a deployment in the browser (an optional extra).

The server (``server``) answers a JSON API with the CLI's own functions (``api``, ``jobs``;
settings parsed by the CLI's options, ``options``) and serves the page from ``static/``,
which ships in the package: nothing is fetched from the network. No formula lives here.
"""
