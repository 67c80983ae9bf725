"""The snapshot format's fingerprint is a function of the state's types alone."""

from __future__ import annotations

import os
import subprocess
import sys

from gitsched.engine.snapshot import STATE_FORMAT, decode_state, encode_state
from gitsched.engine.state import ClusterState


def test_the_format_is_the_same_in_every_process() -> None:
    seen = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                "from gitsched.engine.snapshot import STATE_FORMAT; print(STATE_FORMAT)",
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        seen.add(out.stdout.strip())
    assert seen == {STATE_FORMAT}


def test_an_empty_state_round_trips() -> None:
    assert decode_state(encode_state(ClusterState())) == ClusterState()


def test_a_state_with_nodes_jobs_and_a_pod_template_round_trips() -> None:
    import dataclasses

    from immutables import Map

    from tests.support.factories import job, node, queue

    template = {"spec": {"containers": [{"name": "main", "image": "train:1", "args": ["-x", 2]}]}}
    ml = dataclasses.replace(job("train", replicas=2, gpu=8), template=template)
    state = ClusterState(
        nodes=Map({"n1": node("n1")}),
        queues=Map({"q": queue("q")}),
        jobs=Map({ml.key: ml}),
        events_applied=7,
    )
    again = decode_state(encode_state(state))
    assert again == state
    assert again.jobs[ml.key].template == template
