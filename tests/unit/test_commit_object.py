"""gitsched's own reading of a commit object (reconciler.git.parse_commit_object): headers
by name, a signature's continuation lines skipped, every byte of the message data."""

from __future__ import annotations

from gitsched.reconciler.git import parse_commit_object

TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
PARENT = "a" * 40


def raw(author: str = "Ana Souza <ana@ml.example> 1763283600 +0100", message: str = "s\n") -> bytes:
    return (
        f"tree {TREE}\nparent {PARENT}\nauthor {author}\n"
        f"committer Li Wei <li@ml.example> 1763287200 -0530\n"
        "gpgsig -----BEGIN SSH SIGNATURE-----\n author Mallory <m@x> 1 +0000\n"
        " -----END SSH SIGNATURE-----\n"
        f"\n{message}"
    ).encode()


def test_headers_times_and_a_signature_that_imitates_a_header():
    commit = parse_commit_object("c" * 40, raw())
    assert commit.problem is None
    assert (commit.tree, commit.parents) == (TREE, (PARENT,))
    assert (commit.author.name, commit.author.email) == ("Ana Souza", "ana@ml.example")
    assert commit.author.iso_time == "2025-11-16T10:00:00+01:00"
    assert commit.committer.iso_time == "2025-11-16T04:30:00-05:30"


def test_the_subject_is_gits_first_paragraph_and_separators_are_data():
    message = "\n\n first\x1f line \nsecond\x1e\n\nbody\x00 with a NUL\n"
    commit = parse_commit_object("c" * 40, raw(message=message))
    assert commit.subject == " first\x1f line second\x1e"
    assert commit.message == message.encode()


def test_a_malformed_author_line_is_a_problem_not_an_exception():
    for author in ("Mallory", "Mallory <m@x>", "Mallory <m@x> soon +0000", "<m@x> 1 +99"):
        commit = parse_commit_object("c" * 40, raw(author=author))
        assert commit.problem is not None and "author line" in commit.problem, author
    assert parse_commit_object("c" * 40, None).problem is not None
    assert "tree" in (parse_commit_object("c" * 40, b"author x\n\nm\n").problem or "")
