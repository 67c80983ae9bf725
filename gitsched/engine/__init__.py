"""The pure core of gitsched: the domain model, events, `decide` and `evolve`.

Nothing here does I/O, reads a clock or draws a random number without a seed:
the reconciler, the log and the CLI live at the edges and call in.
"""
