"""Placement: where every job runs. One interface, several solvers.

`plan` holds the typed inputs and outputs, `greedy` the baseline every
scheduler in the field resembles, `check` the independent verifier of any
plan. Solvers that need PuLP are imported only by `solvers`.
"""
