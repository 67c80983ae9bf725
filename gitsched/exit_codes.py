"""Every exit code gitsched gives, defined here once, so a CI job or a script can rely on
it (README, "Exit codes"). A non-zero code always comes with one line on stderr, or with
the findings on stdout, that says why.
"""

from __future__ import annotations

from typing import Protocol

# Done, and the answer is yes: valid, applied, intact, compliant, found.
EXIT_OK = 0
# Done, and the answer is no: a spec is invalid, the branch's newest commit stands
# rejected, the log's hash chain is broken, a compliance control failed.
EXIT_INVALID = 1
# Not done: a usage error (a bad option, a missing file or log), or a bug in gitsched.
EXIT_ERROR = 2
# Done, but what was asked for is not there: a --seq past the log's end, a job, node,
# team or GPU flavor the log never saw.
EXIT_NOT_FOUND = 3

# `gitsched plan` answers "would merging change anything?", as `flux diff` does: 0 no,
# 1 yes (changes to review); a HEAD whose files are invalid is 2, like any error, so a
# CI step cannot mistake it for a reviewable change. Its 1 is not EXIT_INVALID: "no"
# to plan's question is 0.
PLAN_NO_CHANGE = EXIT_OK
PLAN_CHANGES = 1
PLAN_INVALID = EXIT_ERROR


class _Plan(Protocol):
    @property
    def valid(self) -> bool: ...

    @property
    def changed(self) -> bool: ...


def plan_exit_code(plan: _Plan) -> int:
    if not plan.valid:
        return PLAN_INVALID
    return PLAN_CHANGES if plan.changed else PLAN_NO_CHANGE
