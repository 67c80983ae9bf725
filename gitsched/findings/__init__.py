"""A located problem in a spec: the one value both `schemas` (which finds it) and `engine`
(whose CommitRejected records it) speak of. Those two stand alone and may not import each
other, so the type lives here, below both, and imports nothing at all (import-linter says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Finding:
    """One validation or policy error of a commit, located in the repo: what CommitRejected
    records. Found by schemas, policies and the reconciler; one type, one name."""

    file: str
    line: int | None
    column: int | None
    path: str
    message: str
    code: str

    def format(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: {self.path}: {self.message} [{self.code}]"

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "path": self.path,
            "message": self.message,
            "code": self.code,
        }


__all__ = ["Finding"]
