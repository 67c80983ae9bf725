"""Helpers the tests share: real git repos, the real CLI, logs, brokers, API servers.

Test modules import from here, never from one another.
"""
