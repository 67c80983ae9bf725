"""Cross-document rules of a cluster repo, and the Policy they are judged by.

Pure functions over already schema-checked documents: no I/O beyond reading the
built-in policy library that ships inside this package.
"""

from gitsched.policies.policy import default_policy, merge_policies
from gitsched.policies.rules import (
    CLUSTER_FILE,
    Place,
    RepositoryCheck,
    check_repository,
    place_of,
    spread_findings,
)

__all__ = [
    "CLUSTER_FILE",
    "Place",
    "RepositoryCheck",
    "check_repository",
    "default_policy",
    "merge_policies",
    "place_of",
    "spread_findings",
]
