"""gitsched's command line: the composition root that wires the packages together."""

__version__ = "0.1.0"
