"""Where the log lives: `--log`, else `GITSCHED_LOG`, else the repo's `.gitsched/log.db`;
and where a Kafka log's reader keeps its snapshots: `GITSCHED_SNAPSHOT_DIR`, else the
repo's `.gitsched/snapshots/` (a SQLite log keeps them in its own file)."""

from __future__ import annotations

import os
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


def snapshot_dir(repo: str | Path | None) -> Path:
    explicit = os.environ.get("GITSCHED_SNAPSHOT_DIR")
    if explicit:
        return Path(explicit)
    return (Path(repo if repo is not None else ".") / DEFAULT_LOG_DIR / "snapshots").resolve()
