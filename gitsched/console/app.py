"""The console's Starlette routes and its guard: access, limits and security headers.

`console_routes(source)` gives the pages as routes for any Starlette app (serve mounts
them); `console_app(repo, log_url)` wraps them in an app of their own, with the guard
in front: the bearer token or oauth2-proxy's X-Forwarded-User when configured (401
otherwise), 413 for an oversized request, and a Content-Security-Policy with no inline
script on every response. Pages are Jinja2 templates with autoescape on, so job names,
commit messages and reasons are always text. Read-only: no route changes anything.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gitsched.console import views
from gitsched.console.source import ConsoleSource
from gitsched.engine.units import gpus_text
from gitsched.findings import Finding
from gitsched.render_plan import plan_text, summary_text

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
# Scripts and styles come only from the console itself; nothing inline, nothing remote.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]
MAX_BODY_BYTES = 16 * 1024  # the login form is the only body the console reads
MAX_TARGET_BYTES = 8 * 1024  # path and query string together
MAX_PARAM_CHARS = 512
TOKEN_COOKIE = "gitsched_console_token"
SHA = re.compile(r"^[0-9a-f]{7,64}$")

_env = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters["gpus"] = lambda milli: "-" if milli is None else gpus_text(milli)
_env.filters["short"] = lambda sha: (sha or "")[:12]
_env.filters["pct"] = lambda v: "-" if v is None else f"{v:.1f}%"
_env.filters["duration"] = lambda s: "-" if s is None else _duration(s)
_env.filters["urlpart"] = lambda text: quote(str(text), safe="")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} d"


# -- the guard ----------------------------------------------------------------------------


class Access:
    """Who may read: anyone who reaches the port (the default, bound to 127.0.0.1), a holder
    of the bearer token, or, behind oauth2-proxy, whoever it names in X-Forwarded-User."""

    def __init__(
        self,
        token: str | None = None,
        trust_forwarded_user: bool = False,
        allowed_hosts: frozenset[str] | None = None,
    ) -> None:
        self.token = token
        self.trust_forwarded_user = trust_forwarded_user
        # Host names a request may address (None: any). An open console on 127.0.0.1 takes
        # only its loopback names, so a web page that rebinds its own name to 127.0.0.1
        # (DNS rebinding) cannot read the cluster through the user's browser.
        self.allowed_hosts = allowed_hosts

    def host_allowed(self, headers: dict[bytes, bytes]) -> bool:
        if self.allowed_hosts is None:
            return True
        return host_name(headers.get(b"host", b"").decode("latin-1")) in self.allowed_hosts

    @property
    def open(self) -> bool:
        return self.token is None and not self.trust_forwarded_user

    def user(self, headers: dict[bytes, bytes]) -> tuple[bool, str | None]:
        """(allowed, the user's name where a proxy gave one)."""
        if self.trust_forwarded_user:
            forwarded = headers.get(b"x-forwarded-user", b"").decode("latin-1").strip()
            if forwarded:
                return True, forwarded
        if self.token is not None:
            given = _bearer(headers) or _cookie(headers, TOKEN_COOKIE)
            if given is not None and hmac.compare_digest(given.encode(), self.token.encode()):
                return True, None
        return self.open, None


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def host_name(host: str) -> str:
    """'name:port', '[::1]:port' or 'name' -> the name, lower-case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _bearer(headers: dict[bytes, bytes]) -> str | None:
    value = headers.get(b"authorization", b"").decode("latin-1")
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _cookie(headers: dict[bytes, bytes], name: str) -> str | None:
    for part in headers.get(b"cookie", b"").decode("latin-1").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name and value:
            return value
    return None


class Guard:
    """ASGI middleware in front of the console: limits, access, security headers."""

    def __init__(self, app: ASGIApp, access: Access, source: ConsoleSource | None = None) -> None:
        self.app = app
        self.access = access
        self.source = source  # the console's, to stop when a host app shuts down

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v) for k, v in message.get("headers", []) if k not in _SECURITY_NAMES
                ]
                message["headers"] = headers + SECURITY_HEADERS
            await send(message)

        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        path = scope.get("path", "")
        client = (scope.get("client") or ("?", 0))[0]
        target = len(scope.get("raw_path") or path.encode()) + len(scope.get("query_string", b""))
        length = headers.get(b"content-length", b"0")
        too_long = not length.isdigit() or int(length) > MAX_BODY_BYTES
        if target > MAX_TARGET_BYTES or too_long:
            log.warning("console: 413 for %s %s from %s", scope["method"], path[:200], client)
            await error_page(413, "This request is too large for the console.")(
                scope, receive, send_secured
            )
            return
        if not self.access.host_allowed(headers):
            log.warning("console: 400 for Host %r from %s", headers.get(b"host", b"")[:100], client)
            await error_page(
                400,
                "This console answers only to the names it is served as (loopback, unless a "
                "token or an auth proxy guards it): see docs/console.md.",
            )(scope, receive, send_secured)
            return
        allowed, user = self.access.user(headers)
        relative = path[len(scope.get("root_path", "")) :] if scope.get("root_path") else path
        if not allowed and not relative.startswith(("/static/", "/login")):
            log.warning("console: 401 for %s %s from %s", scope["method"], path[:200], client)
            response = error_page(
                401,
                "Sign in: this console needs a token (or its auth proxy's user).",
                login=self.access.token is not None,
                root=scope.get("root_path", ""),
            )
            response.headers["www-authenticate"] = 'Bearer realm="gitsched console"'
            await response(scope, receive, send_secured)
            return
        scope.setdefault("state", {})["console_user"] = user
        await self.app(scope, _limited(receive), send_secured)


_SECURITY_NAMES = {name for name, _ in SECURITY_HEADERS}


def _limited(receive: Receive) -> Receive:
    """A body sent without Content-Length still stops at MAX_BODY_BYTES."""
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > MAX_BODY_BYTES:
                raise HTTPException(413, "This request is too large for the console.")
        return message

    return wrapped


def error_page(
    status: int, message: str, *, login: bool = False, root: str = "", problem: str | None = None
) -> HTMLResponse:
    titles = {
        400: "Bad request",
        401: "Unauthorized",
        404: "Not found",
        405: "Method not allowed",
        413: "Request too large",
        500: "Console error",
        503: "Not ready",
    }
    html = _env.get_template("error.html").render(
        base=root,
        status=status,
        title=titles.get(status, "Error"),
        message=message,
        login=login,
        problem=problem,
        head=None,
        nav=None,
    )
    return HTMLResponse(html, status_code=status)


# -- query parameters ---------------------------------------------------------------------


def _params(request: Request, allowed: set[str]) -> dict[str, str]:
    """The query's parameters, each at most once, each known and short; else 400."""
    pairs = parse_qsl(request.url.query, keep_blank_values=True)
    out: dict[str, str] = {}
    for key, value in pairs:
        if key not in allowed:
            raise HTTPException(400, f"unknown query parameter {key!r}")
        if key in out:
            raise HTTPException(400, f"query parameter {key!r} given twice")
        if len(value) > MAX_PARAM_CHARS:
            raise HTTPException(400, f"query parameter {key!r} is too long")
        out[key] = value
    return out


def _positive_int(params: dict[str, str], key: str) -> int | None:
    text = params.get(key)
    if text is None or text == "":
        return None
    if not text.isdigit() or len(text) > 12 or int(text) < 1:
        raise HTTPException(400, f"query parameter {key!r} must be a whole number from 1")
    return int(text)


# -- pages --------------------------------------------------------------------------------

NAV = (
    ("overview", "/", "Overview"),
    ("queues", "/queues", "Queues"),
    ("jobs", "/jobs", "Jobs"),
    ("services", "/services", "Services and workspaces"),
    ("changes", "/changes", "Changes and compliance"),
    ("pulls", "/pulls", "Open pull requests"),
)


class Pages:
    """The console's request handlers over one `ConsoleSource`."""

    def __init__(self, source: ConsoleSource) -> None:
        self.source = source

    def render(self, request: Request, template: str, nav: str, **context: Any) -> HTMLResponse:
        snapshot = self.source.snapshot
        state = snapshot.state
        head = {
            "seq": snapshot.seq,
            "version": self.version(),
            "cluster": state.cluster.name if state.cluster else None,
            "commit": state.last_good_commit,
            "rejected": state.last_commit
            if state.last_rejection and state.last_commit is not None
            else None,
        }
        html = _env.get_template(template).render(
            base=request.scope.get("root_path", ""),
            nav=nav,
            navs=NAV,
            head=head,
            problem=self.source.problem,
            user=request.scope.get("state", {}).get("console_user"),
            **context,
        )
        return HTMLResponse(html)

    def version(self) -> str:
        """What a page shows changes with this: the log's seq, the problem, the plans."""
        plans = ",".join(f"{p.branch}@{p.sha[:12]}:{p.seq}" for p in self.source.plans.values())
        plans += "|" + ",".join(f"{b}@{sha[:12]}" for b, sha, _ in self.source.branches or ())
        return f"{self.source.snapshot.seq}|{self.source.problem or ''}|{plans}"

    def not_ready(self) -> None:
        """Before the log was ever read, nothing can be said not to exist: 503, not 404."""
        if not self.source.loaded:
            raise HTTPException(
                503, f"The console has not read the log yet: {self.source.problem or 'reading'}"
            )

    async def overview(self, request: Request) -> Response:
        _params(request, set())
        data = await _in_thread(views.overview, self.source.snapshot)
        return self.render(request, "overview.html", "overview", o=data)

    async def queues(self, request: Request) -> Response:
        _params(request, set())
        snapshot = self.source.snapshot

        def read() -> list[dict[str, Any]]:
            with self.source.reading() as store:
                return views.queues(snapshot, store)

        return self.render(request, "queues.html", "queues", queues=await _in_thread(read))

    async def queue(self, request: Request) -> Response:
        _params(request, set())
        name = request.path_params["name"]
        snapshot = self.source.snapshot

        def read() -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
            with self.source.reading() as store:
                rows = views.queues(snapshot, store)
                found = next((q for q in rows if q["name"] == name), None)
                if found is None or store is None:
                    return found, []
                return found, views.queue_history(snapshot, store, name)

        found, history = await _in_thread(read)
        if found is None:
            self.not_ready()
            raise HTTPException(404, f"There is no queue {name!r} in the cluster.")
        used = [r["used_share_pct"] for r in history]
        shares = [r["fair_share_pct"] for r in history]
        top = max(used + shares, default=0.0)
        points = views.sparkline(used, top)
        fair = views.sparkline(shares, top)
        return self.render(
            request,
            "queue.html",
            "queues",
            q=found,
            history=history,
            used_points=points,
            fair_points=fair,
        )

    async def jobs(self, request: Request) -> Response:
        params = _params(request, {"team", "queue", "state", "flavor", "page"})
        snapshot = self.source.snapshot
        page = _positive_int(params, "page") or 1
        choices = views.filter_values(snapshot)
        filters = {}
        for key in ("team", "queue", "state", "flavor"):
            value = params.get(key, "")
            if value == "":
                continue
            if key == "state" and value not in views.JOB_STATES:
                raise HTTPException(
                    400, f"state must be one of {', '.join(views.JOB_STATES)}, not {value!r}"
                )
            filters[key] = value
        data = await _in_thread(views.jobs, snapshot, filters, page)
        if page > data["pages"]:
            raise HTTPException(400, f"page {page} is past the last page ({data['pages']})")
        query = "&".join(f"{k}={quote(v, safe='')}" for k, v in filters.items())
        return self.render(
            request, "jobs.html", "jobs", j=data, filters=filters, choices=choices, query=query
        )

    async def job(self, request: Request) -> Response:
        _params(request, set())
        key = f"{request.path_params['queue']}/{request.path_params['name']}"
        snapshot = self.source.snapshot

        def read() -> dict[str, Any] | None:
            with self.source.reading() as store:
                return views.job(snapshot, store, key)

        data = await _in_thread(read)
        if data is None:
            self.not_ready()
            raise HTTPException(404, f"The log never saw a job {key!r}.")
        return self.render(request, "job.html", "jobs", job=data)

    async def services(self, request: Request) -> Response:
        _params(request, set())
        snapshot = self.source.snapshot

        def read() -> dict[str, Any]:
            with self.source.reading() as store:
                return views.services(snapshot, store)

        return self.render(request, "services.html", "services", s=await _in_thread(read))

    async def changes(self, request: Request) -> Response:
        params = _params(request, {"before"})
        before = _positive_int(params, "before")

        def read() -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
            with self.source.reading() as store:
                if store is None:
                    return None, None
                return views.changes(store, before), views.compliance(store)

        changes, compliance = await _in_thread(read)
        return self.render(
            request, "changes.html", "changes", changes=changes, compliance=compliance
        )

    async def commit(self, request: Request) -> Response:
        _params(request, set())
        sha = request.path_params["sha"].lower()

        def read() -> dict[str, Any] | None:
            if not SHA.match(sha):
                return None
            with self.source.reading() as store:
                return views.commit(store, sha) if store is not None else None

        found = await _in_thread(read)
        if found is None:
            self.not_ready()
            raise HTTPException(404, f"The log never recorded a commit {sha!r}.")
        state = self.source.snapshot.state
        errors: tuple[Finding, ...] = ()
        if (
            not found["applied"]
            and state.last_commit is not None
            and state.last_commit.sha == found["sha"]
        ):
            errors = state.last_rejection
        return self.render(request, "commit.html", "changes", c=found, errors=errors)

    async def pulls(self, request: Request) -> Response:
        _params(request, set())
        plans = []
        # The plan thread lists the branches (git, per branch) every few seconds; a page
        # reads its list. With plans off, or before its first pass, the page lists them.
        listed = self.source.branches
        problem = self.source.plans_problem
        if listed is None:
            try:
                listed = await _in_thread(self.source.open_branches)
            except Exception as e:  # git missing or the repo gone: say so on the page
                listed, problem = [], str(e)
        branches = listed
        for name, sha, subject in branches:
            known = self.source.plans.get(name)
            entry: dict[str, Any] = {"branch": name, "sha": sha, "subject": subject}
            if known is None or known.sha != sha:
                entry["status"] = "planning"
            elif known.error is not None:
                entry["status"] = "error"
                entry["error"] = known.error
            else:
                assert known.plan is not None
                entry["status"] = "stale" if known.seq != self.source.snapshot.seq else "ready"
                entry["summary"] = summary_text(known.plan)
                entry["text"] = plan_text(known.plan)
                entry["effects"] = known.plan.effects
                entry["valid"] = known.plan.valid
                entry["errors"] = known.plan.errors
            plans.append(entry)
        return self.render(
            request,
            "pulls.html",
            "pulls",
            plans=plans,
            plans_problem=problem,
            branch=self.source.branch,
            enabled=self.source.with_plans,
        )

    async def events(self, request: Request) -> Response:
        """Server-sent events: one `head` event whenever the log's seq, the problem or the
        plans change, and a comment every 15 s to keep proxies from closing the stream."""

        async def stream() -> AsyncIterator[str]:
            last: str | None = None
            quiet = 0.0
            while not self.source.stopped:
                version = self.version()
                if version != last:
                    last = version
                    quiet = 0.0
                    data = {
                        "version": version,
                        "seq": self.source.snapshot.seq,
                        "problem": self.source.problem,
                    }
                    yield f"event: head\ndata: {json.dumps(data)}\n\n"
                elif quiet >= 15.0:
                    quiet = 0.0
                    yield ": still here\n\n"
                if await request.is_disconnected():
                    return
                await asyncio.sleep(0.25)
                quiet += 0.25

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"x-accel-buffering": "no"}
        )

    async def login_form(self, request: Request) -> Response:
        _params(request, set())
        return error_page(
            401, "Enter the console's token.", login=True, root=request.scope.get("root_path", "")
        )

    async def login(self, request: Request) -> Response:
        # The form is one urlencoded field: parsed here, with no multipart library.
        body = (await request.body()).decode("utf-8", "replace")
        token = dict(parse_qsl(body)).get("token", "")
        root = request.scope.get("root_path", "")
        response = RedirectResponse(f"{root}/", status_code=303)
        response.set_cookie(
            TOKEN_COOKIE,
            token,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path=f"{root}/" if root else "/",
        )
        return response


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Reads of SQLite and folds of big tables off the event loop, so SSE keeps flowing."""
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(fn, *args)


def console_routes(source: ConsoleSource) -> list[BaseRoute]:
    """The console's routes over `source` (started on the first request, if not before)."""
    pages = Pages(source)

    def started(handler: Callable[[Request], Awaitable[Response]]) -> Any:
        async def run(request: Request) -> Response:
            if not source.started:
                await _in_thread(source.start)
            return await handler(request)

        return run

    return [
        Route("/", started(pages.overview), name="console-overview"),
        Route("/queues", started(pages.queues)),
        Route("/queues/{name}", started(pages.queue)),
        Route("/jobs", started(pages.jobs)),
        Route("/jobs/{queue}/{name:path}", started(pages.job)),
        Route("/services", started(pages.services)),
        Route("/changes", started(pages.changes)),
        Route("/commits/{sha}", started(pages.commit)),
        Route("/pulls", started(pages.pulls)),
        Route("/events", started(pages.events)),
        Route("/login", pages.login_form, methods=["GET"]),
        Route("/login", pages.login, methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="console-static"),
    ]


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    response = error_page(
        exc.status_code, str(exc.detail or "Error"), root=request.scope.get("root_path", "")
    )
    for name, value in (exc.headers or {}).items():  # e.g. a 405's Allow
        response.headers[name] = value
    if exc.status_code == 503:
        response.headers["retry-after"] = "5"
    return response


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("console: %s %s failed", request.method, request.url.path, exc_info=exc)
    return error_page(
        500,
        "The console failed to build this page; its log says why.",
        root=request.scope.get("root_path", ""),
    )


EXCEPTION_HANDLERS: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
    HTTPException: _http_error,
    Exception: _server_error,
}


def console_app(
    repo: str | Path,
    log_url: str,
    *,
    token: str | None = None,
    trust_forwarded_user: bool = False,
    allowed_hosts: frozenset[str] | None = None,
    source: ConsoleSource | None = None,
    **source_options: Any,
) -> Guard:
    """The console as an ASGI app of its own (guard included), for `gitsched console` or to
    mount under a prefix of another Starlette app (e.g. Mount("/console", app=...)); its
    source starts on the first request and stops with the app's lifespan."""
    source = source or ConsoleSource(repo, log_url, prepare=views.prepare, **source_options)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await _in_thread(source.stop)

    app = Starlette(
        routes=console_routes(source),
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=lifespan,
    )
    return Guard(app, Access(token, trust_forwarded_user, allowed_hosts), source)
