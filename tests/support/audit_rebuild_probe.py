"""A rebuild of the simulated log's audit view in a writer process, run by
test_audit_views.py in a subprocess whose own PYTHONHASHSEED and its writer's differ from
each other and from the test's: the folded state the view saves must be the same bytes
whatever order str hashes give sets and dicts in the three processes.

    python -m tests.support.audit_rebuild_probe VIEW WRITER_HASH_SEED
"""

from __future__ import annotations

import os
import sys

from gitsched.audit.catchup import rebuild
from gitsched.audit.store import EventList
from gitsched.simulation.history import synthetic_events

# The log test_a_rebuild_in_a_writer_process_equals_one_folded_in_process folds: days long,
# so usage rolls up over many days, in batches small enough to make many frames.
EVENTS, SEED, MEAN_GAP_S, BATCH_EVENTS = 3000, 1, 300.0, 400


def main(view: str, writer_seed: str) -> None:
    os.environ["PYTHONHASHSEED"] = writer_seed  # the writer process inherits it
    events = synthetic_events(EVENTS, SEED, MEAN_GAP_S)
    result = rebuild(EventList(events), view, batch_events=BATCH_EVENTS, writer_process=True)
    assert result.last_seq == EVENTS, result


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
