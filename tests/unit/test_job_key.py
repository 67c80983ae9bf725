"""Job.key is worked out once, when the job is made: it must follow the job's fields
wherever a job is made (the constructor, dataclasses.replace, the log's decoder, a
snapshot, a worker's pickle), and never reach an event."""

from __future__ import annotations

import dataclasses
import pickle

import msgspec

from gitsched.engine import events as ev
from gitsched.engine.codec import from_data, to_data
from gitsched.engine.model import Job, job_key
from gitsched.engine.snapshot import decode_state, encode_state
from gitsched.engine.state import ClusterState
from tests.support.factories import job


def test_the_key_is_the_queue_and_the_name() -> None:
    made = job("train", queue="research")
    assert made.key == "research/train" == job_key("research", "train")


def test_a_replaced_job_has_the_key_of_its_new_fields() -> None:
    made = job("train", queue="research")
    assert dataclasses.replace(made, name="eval").key == "research/eval"
    assert dataclasses.replace(made, queue="prod").key == "prod/train"


def test_the_key_is_no_argument_no_part_of_equality_and_not_shown() -> None:
    made = job("train", queue="research")
    assert "key" not in {f.name for f in dataclasses.fields(Job) if f.init}
    assert "key=" not in repr(made)
    assert made == job("train", queue="research")
    assert hash(made) == hash(job("train", queue="research"))


def test_an_event_carries_the_fields_only_and_decodes_to_the_same_key() -> None:
    made = job("train", queue="research")
    data = to_data(ev.JobSubmitted(job=made))
    assert "key" not in data["job"]
    assert set(data["job"]) == {f.name for f in dataclasses.fields(Job) if f.init}
    again = from_data(ev.JobSubmitted, data)
    assert again.job == made
    assert again.job.key == "research/train"


def test_a_decoded_key_that_disagrees_with_the_fields_is_worked_out_again() -> None:
    data = {**to_data(job("train", queue="research")), "key": "other/name"}
    assert from_data(Job, data).key == "research/train"


def test_pickle_and_snapshot_keep_the_key() -> None:
    made = job("train", queue="research")
    assert pickle.loads(pickle.dumps(made)).key == "research/train"
    state = ClusterState(jobs=ClusterState().jobs.set(made.key, made))
    assert decode_state(encode_state(state)).jobs[made.key].key == "research/train"


def test_a_snapshot_written_before_the_key_existed_decodes_with_keys() -> None:
    """A snapshot's format names the state's shape, so an older one is skipped (the
    snapshot store's contract tests); were one read all the same, its jobs get keys."""
    made = job("train", queue="research")
    body = encode_state(ClusterState(jobs=ClusterState().jobs.set(made.key, made)))
    raw = msgspec.msgpack.decode(body)
    for stored in raw["jobs"].values():
        del stored["key"]
    again = decode_state(msgspec.msgpack.encode(raw))
    assert again.jobs[made.key].key == "research/train"
