"""The reconciler: reads the cluster repo's commits, validates them and appends events.

It composes the pure core with the edges: git (source), schemas and policies
(validation), the event log (sink) and the placement solvers.
"""
