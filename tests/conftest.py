"""Hypothesis profiles, loaded before any test module builds its settings.

`repeatable` (the default; what `scripts/test` and CI run): every property test draws the
same examples on every run, seeded from the test itself, so a run's verdict is a function
of the tree (a red CI run is red again on rerun, and a green one is not luck).
`explore` (GITSCHED_HYPOTHESIS=explore): fresh random examples each run, failures kept in
.hypothesis/ and replayed first; run it to look for new counterexamples, and turn each one
found into a plain test beside the rule it breaks (tests/unit/test_moves.py has one).
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("repeatable", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("GITSCHED_HYPOTHESIS", "repeatable"))
