"""CLI command ``ui``: serve the browser page on this machine and open it.

Module level: typer and the standard library only (the server is imported when the command
runs, so ``perfmodel --help`` stays fast). No ``from __future__ import annotations``: typer
reads the Annotated option types.
"""

from pathlib import Path
from typing import Annotated

import typer

Opt = typer.Option


def ui_cmd(
    host: Annotated[str, Opt(help=(
        "address to listen on; 127.0.0.1 (the default) answers this machine only; any "
        "other needs --allow-remote"))] = "127.0.0.1",
    port: Annotated[int, Opt(min=0, max=65535, help="port (0: any free one)")] = 8765,
    browser: Annotated[bool, Opt(help="open the page in the default browser")] = True,
    log: Annotated[bool, Opt(help="print each request on stderr")] = False,
    root: Annotated[Path | None, Opt(help=(
        "a folder whose files the page may name as models, devices and traces (default: "
        "none; the page names shipped specs and uploads only)"))] = None,
    allow_remote: Annotated[bool, Opt(help=(
        "answer other machines too (with --host 0.0.0.0 or an address of this one): any "
        "Host name is accepted, and every API call still needs the token"))] = False,
) -> None:
    """Explore a deployment in the browser: estimate, roofline, batch curves, simulation
    and plan, each with the command line that reproduces it. Offline; Ctrl-C stops it."""
    import signal
    import webbrowser

    from perfmodel.cli.errors import fail
    from perfmodel.specs.errors import SpecError
    from perfmodel.ui.guard import loopback
    from perfmodel.ui.server import Server

    if not (loopback(host) or allow_remote):
        fail(f"--host: {host} is not a loopback address: the page would answer every "
             "network it is on; give --allow-remote as well (the token is still needed)")
    try:
        server = Server(host, port, quiet=not log, root=root, allow_remote=allow_remote)
    except SpecError as exc:
        fail(str(exc))
    except OSError as exc:
        import errno
        import socket

        if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
            fail(f"--host: cannot listen on {host!r} ({exc.strerror or exc}), expected an "
                 "address of this machine (127.0.0.1, the default)")
        fail(f"--port: cannot listen on {host}:{port} ({exc.strerror or exc}), expected a "
             "free port (--port 0 picks one)")
    scope = "this machine only" if loopback(host) else \
        f"every client that can reach {host}, with the token"
    typer.echo(f"perfmodel ui: serving {server.url} ({scope}); Ctrl-C stops it", err=True)
    if browser:
        webbrowser.open(server.url)
    signal.signal(signal.SIGTERM, _interrupt)   # kill: stop as Ctrl-C does, uploads removed
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        typer.echo("perfmodel ui: stopped", err=True)
    finally:
        server.server_close()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
