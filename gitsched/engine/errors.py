"""gitsched's one error tree. It lives in the engine, the lowest layer, so every layer
above may derive from it (the event log's errors, the cluster boundary's, audit's ...).

Adapters wrap library errors in these (`raise ... from e`), so the reconciler
can tell a bad commit (record it, move on) from an outage (retry with backoff).
`schemas`, beside the engine, raises nothing: a spec's problems are values
(`findings.Finding`, which CommitRejected records as they are), never exceptions.
"""

from __future__ import annotations


class GitschedError(Exception):
    """Root of every error gitsched raises on purpose."""


class PermanentError(GitschedError):
    """Retrying will not help: bad input, a rejected commit, a refused configuration."""


class TemporaryError(GitschedError):
    """Retrying later may help: a broker down, a lock held."""


class UsageError(PermanentError):
    """The command line or configuration asks for something that cannot be done."""


class SolverFailed(GitschedError):
    """A MILP solver library failed outright (not installed, crashed, could not run): the
    plan falls back to greedy's and says why. Raised only where we call the library, so a
    bug in our own formulation is never mistaken for one."""
