"""The read-only web console: the audit view and the folded state as pages that follow the log.

`console_app(repo, log_url)` is an ASGI app of its own (`gitsched console` serves it);
`console_routes(source)` gives its routes to mount in another Starlette app.
"""

from gitsched.console.app import console_app, console_routes
from gitsched.console.source import ConsoleSource

__all__ = ["ConsoleSource", "console_app", "console_routes"]
