"""`gitsched inventory nvml`: this host's GPUs as a Node document to commit or compare."""

from __future__ import annotations

import json
import sys

import click
import yaml

from gitsched.exit_codes import EXIT_ERROR
from gitsched.options import (
    fail,
    format_option,
    user_errors,
)
from gitsched.reconciler.nvml import node_document, read_gpus
from gitsched.schemas import Document, validate_document


@click.group()
def inventory() -> None:
    """Live inventory sources."""


@inventory.command()
@click.option("--name", help="Node name [default: the host name].")
@click.option("--region", help="Region for data residency.")
@click.option(
    "--topology",
    "topology",
    multiple=True,
    metavar="LEVEL=DOMAIN",
    help="e.g. rack=rack-a (repeatable).",
)
@format_option("yaml", "json")
def nvml(name: str | None, region: str | None, topology: tuple[str, ...], fmt: str) -> None:
    """Read this host's GPUs through NVML and print a Node document."""
    labels = {}
    for item in topology:
        level, sep, domain = item.partition("=")
        if not sep or not level or not domain:
            fail(f"--topology {item!r}: expected LEVEL=DOMAIN")
        labels[level] = domain
    with user_errors():
        doc = node_document(read_gpus(), name=name, region=region, topology=labels)
    errors = validate_document(Document("<nvml>", 0, doc, {}))
    if errors:
        fail(
            "NVML produced an invalid Node document (a gitsched bug): "
            + "; ".join(e.message for e in errors),
            EXIT_ERROR,
        )
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
    else:
        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False))
