"""`gitsched console`: the read-only web console of a cluster repo and its log, served by uvicorn."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from gitsched.config import resolve_log_url
from gitsched.exit_codes import EXIT_ERROR
from gitsched.options import fail, log_option

log = logging.getLogger(__name__)


def parse_listen(listen: str) -> tuple[str, int]:
    """'HOST:PORT' (IPv6 as [::1]:8080) -> (host, port); a usage error otherwise."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535 or not host:
        fail(f"--listen wants HOST:PORT (e.g. 127.0.0.1:8080), not {listen!r}")
    return host.strip("[]"), int(port)


def read_token(path: str) -> str:
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"cannot read --token-file {path}: {e}")
    if len(token) < 16 or any(c.isspace() for c in token):
        fail(f"the token in {path} must be one word of at least 16 characters")
    return token


@click.command()
@click.option(
    "--repo",
    default=".",
    show_default=True,
    type=click.Path(exists=True, file_okay=False),
    help="The cluster repo (its branches are the open pull requests; its .gitsched/ the default log).",
)
@log_option
@click.option(
    "--listen",
    default="127.0.0.1:8080",
    show_default=True,
    help="Address and port to serve on. Keep 127.0.0.1 unless a token or an auth proxy guards it.",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    envvar="GITSCHED_CONSOLE_TOKEN_FILE",
    show_envvar=True,
    help="Require this bearer token (Authorization: Bearer ..., or the sign-in form's cookie).",
)
@click.option(
    "--trust-forwarded-user",
    is_flag=True,
    help="Let in requests that oauth2-proxy (or a like proxy) names in X-Forwarded-User. Only "
    "behind such a proxy, with the console reachable from it alone.",
)
@click.option("--branch", default="main", show_default=True, help="The branch the cluster follows.")
@click.option(
    "--interval",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds between looks at the log for new events.",
)
@click.option(
    "--no-plans", is_flag=True, help="Do not plan open branches (the PR page stays empty)."
)
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    help="A host name requests may address besides the loopback ones, when the console is "
    "open (no token, no auth proxy); repeatable. Others get 400 (DNS rebinding).",
)
def console(
    repo: str,
    log_url: str | None,
    listen: str,
    token_file: str | None,
    trust_forwarded_user: bool,
    branch: str,
    interval: float,
    no_plans: bool,
    allow_hosts: tuple[str, ...],
) -> None:
    """Serve the read-only web console: overview, queues, jobs, changes, open pull requests.

    It reads the log through the audit view (caught up as the log grows) and
    follows it live. It cannot change anything: changes go through git.
    See docs/console.md for exposing it safely.
    """
    import uvicorn

    from gitsched.console.app import LOOPBACK_HOSTS, console_app

    host, port = parse_listen(listen)
    token = read_token(token_file) if token_file else None
    if host not in ("127.0.0.1", "localhost", "::1") and token is None and not trust_forwarded_user:
        click.echo(
            f"gitsched console: warning: serving on {host} with no --token-file and no "
            "--trust-forwarded-user: anyone who reaches the port can read the cluster "
            "(requests must name it by a loopback name or an --allow-host one)",
            err=True,
        )
    url = resolve_log_url(log_url, repo)
    guarded = token is not None or trust_forwarded_user
    app = console_app(
        repo,
        url,
        token=token,
        trust_forwarded_user=trust_forwarded_user,
        # Open, the console answers only to loopback names (and --allow-host ones).
        allowed_hosts=None
        if guarded
        else LOOPBACK_HOSTS | {host.lower()} | {h.lower() for h in allow_hosts},
        branch=branch,
        interval_s=interval,
        plans=not no_plans,
    )
    click.echo(f"gitsched console: http://{listen}/ (log {url})", err=True)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=3,
        # The console's own limits (gitsched.console.app.Guard) answer 413 before these.
        h11_max_incomplete_event_size=64 * 1024,
    )
    assert app.source is not None
    end_streams = app.source.request_stop

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: object) -> None:
            # Live pages hold an event stream open: end them first, so that shutting down
            # waits for no one.
            end_streams()
            super().handle_exit(sig, frame)  # type: ignore[arg-type]
            # uvicorn raises the signal again once it has shut down (dying by it); a
            # console asked to stop has stopped: exit 0, as `gitsched serve` does.
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):
                captured.clear()

    server = Server(config)
    try:
        server.run()
    except OSError as e:
        fail(f"cannot serve on {listen}: {e}")
    if not server.started:
        sys.exit(EXIT_ERROR)
