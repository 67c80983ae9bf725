"""Where the log lives: `--log`, else `GITSCHED_LOG`, else the repo's `.gitsched/log.db`."""

from __future__ import annotations

from pathlib import Path

DEFAULT_LOG_DIR = ".gitsched"
DEFAULT_LOG_FILE = "log.db"


def default_log_url(repo: str | Path) -> str:
    path = (Path(repo) / DEFAULT_LOG_DIR / DEFAULT_LOG_FILE).resolve()
    return f"sqlite:///{path}"


def resolve_log_url(explicit: str | None, repo: str | Path | None) -> str:
    if explicit:
        return explicit
    return default_log_url(repo if repo is not None else ".")
