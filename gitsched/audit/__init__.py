"""Audit: answers for auditors, folded from the log and verifiable against it."""
