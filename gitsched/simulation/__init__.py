"""Simulations that drive the product: openb trace replays, synthetic clusters, and
the cluster histories the benchmarks measure audit on.

This package sits beside the product, never inside it: it feeds workloads to the
reconciler's own decision step and placers (what we benchmark is what we run), and
nothing in engine, schemas, policies, eventlog, reconciler, audit or cluster imports
it (an import-linter contract).
"""
