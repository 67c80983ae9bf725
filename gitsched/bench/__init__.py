"""`gitsched bench ...`: the benchmarks of BENCHMARKS.md, each a command printing a table or JSON.

Each benchmark lives in its own module and exposes `command`.
"""

from __future__ import annotations

import click

from gitsched.options import LazyGroup


@click.group(
    cls=LazyGroup,
    lazy={
        "openb": "gitsched.bench.openb:command",
        "synth": "gitsched.bench.synth:command",
        "log": "gitsched.bench.log:command",
        "audit": "gitsched.bench.audit:command",
        "reconcile": "gitsched.bench.reconcile:command",
        "kube": "gitsched.bench.kube:command",
        "trace": "gitsched.bench.trace:command",
        "console": "gitsched.bench.console:command",
        "serving": "gitsched.bench.serving:command",
    },
)
def bench() -> None:
    """Benchmarks: placement quality and speed, log throughput, audit and console latency."""
