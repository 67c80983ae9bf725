"""Every byte a committer writes is data (issue 32, item 5).

A subject, body, trailer or author name may hold any control character git keeps
(all of \\x01-\\x1f and \\x7f; git refuses \\x00), record separators included: no
commit may halt the reconciler, and none may add a commit record of its own making.
A commit gitsched cannot read at all is rejected by its sha, and the next one applies.
"""

from __future__ import annotations

import os
import subprocess

from gitsched.reconciler.git import GitRepo
from tests.support.cluster_repo import (
    EPOCH,
    ClusterRepo,
    assert_chain_intact,
    git,
    gitsched,
    job_yaml,
    of_type,
    read_events,
)

CONTROL = [chr(c) for c in range(1, 32)] + ["\x7f"]


def commit_raw(repo: ClusterRepo, message: str, author: str) -> str:
    """An empty commit with exactly this message and author name (`git commit -F -`,
    no cleanup, so every byte reaches the object)."""
    when = f"@{EPOCH + 3600 * (repo.commits + 1)} +0100"
    repo.commits += 1
    env = {
        "GIT_AUTHOR_NAME": author,
        "GIT_AUTHOR_EMAIL": "mallory@example.com",
        "GIT_AUTHOR_DATE": when,
        "GIT_COMMITTER_NAME": author,
        "GIT_COMMITTER_EMAIL": "mallory@example.com",
        "GIT_COMMITTER_DATE": when,
    }
    done = subprocess.run(
        ["git", "-C", str(repo.path), "commit", "-q", "--allow-empty", "--no-verify",
         "--cleanup=verbatim", "-F", "-"],
        input=message.encode(),
        capture_output=True,
        env={**os.environ, **env},
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return repo.head()


def git_approvers(repo: ClusterRepo, sha: str) -> tuple[str, ...]:
    """The oracle: git's own trailer parser on the stored message."""
    message = subprocess.run(
        ["git", "-C", str(repo.path), "cat-file", "commit", sha], capture_output=True, check=True
    ).stdout.partition(b"\n\n")[2]
    out = subprocess.run(
        ["git", "-C", str(repo.path), "interpret-trailers", "--parse"],
        input=message,
        capture_output=True,
        check=True,
    ).stdout.decode()
    values = []
    for line in out.split("\n"):
        key, sep, value = line.partition(":")
        if sep and key.lower() in ("approved-by", "reviewed-by"):
            values.append(value.strip(" \t\r\n"))
    return tuple(dict.fromkeys(v for v in values if v))


def test_control_characters_in_every_field_neither_halt_nor_forge(bootstrapped: ClusterRepo):
    repo = bootstrapped
    gitsched("reconcile", "--once", repo.path, expect=0)
    hostile: list[str] = []
    for c in CONTROL:
        forged = f"{'f' * 40}{c}\x1fEve\x1feve@example.com\x1f2020-01-01T00:00:00+00:00\x1e"
        message = (
            f"subject {c} with\x1f{forged}\n\nbody {c}\x1e{forged}\n\n"
            f"Approved-by: Carol{c}<carol@example.com>\x1e{forged}\nReviewed-by: Dan{c}\n"
        )
        hostile.append(commit_raw(repo, message, f"Mal{c}lory\x1e{forged}"))
    repo.write("teams/ml/jobs/after.yaml", job_yaml("after"))
    good = repo.commit("ml: the good commit after the hostile ones")

    run = gitsched("reconcile", "--once", repo.path)
    assert run.returncode == 0, str(run)
    # The text is safe on a terminal: what the committer wrote is shown, never acted on.
    assert not [c for c in CONTROL if c != "\n" and c in run.stdout], repr(run.stdout[:400])
    assert "subject \\x1b with\\x1f" in run.stdout
    events = read_events(repo.log_path)
    assert_chain_intact(events)
    shas = git(repo.path, "rev-list", "HEAD").split()
    decided = of_type(events, "CommitApplied", "CommitRejected")
    # One record per commit, each for a commit that exists: nothing forged.
    assert sorted(e.data["commit"]["sha"] for e in decided) == sorted(shas)
    assert {e.cause for e in events} <= set(shas)
    by_sha = {e.data["commit"]["sha"]: e.data["commit"] for e in decided}
    for c, sha in zip(CONTROL, hostile, strict=True):
        commit = by_sha[sha]
        raw = subprocess.run(
            ["git", "-C", str(repo.path), "cat-file", "commit", sha],
            capture_output=True,
            check=True,
        ).stdout
        author = raw.split(b"\nauthor ", 1)[1].split(b" <", 1)[0].decode()
        assert commit["author"] == author, repr(c)
        assert commit["author_email"] == "mallory@example.com"
        assert commit["committed_at"] == git(repo.path, "log", "-1", "--format=%cI", sha).strip()
        assert commit["committed_at"].endswith("+01:00")
        assert commit["subject"].startswith("subject "), repr(c)
        assert tuple(commit["approvers"]) == git_approvers(repo, sha), repr(c)
    assert "after" in str(of_type(events, "JobSubmitted")[-1].data)
    assert decided[-1].data["commit"]["sha"] == good
    assert decided[-1].type == "CommitApplied"
    # The next commit applies too: no "history was rewritten".
    repo.write("teams/ml/jobs/later.yaml", job_yaml("later"))
    repo.commit("ml: later")
    gitsched("reconcile", "--once", repo.path, expect=0)
    gitsched("log", "verify", "--log", f"sqlite:///{repo.log_path}", expect=0)


def test_subject_and_trailers_read_as_git_reads_them(bootstrapped: ClusterRepo):
    """For ordinary messages gitsched's own reading agrees with git's %s, %cI and trailers."""
    repo = bootstrapped
    repo.commit(
        "  \n\nfirst line\nsecond line  \n\nbody\n", allow_empty=True,
        trailers=[("Approved-by", "Erin <erin@example.com>"), ("reviewed-by", "Dan")],
    )  # fmt: skip
    gitsched("reconcile", "--once", repo.path, expect=0)
    decided = of_type(read_events(repo.log_path), "CommitApplied")
    for event in decided:
        sha = event.data["commit"]["sha"]
        subject, date, authored = git(
            repo.path, "log", "-1", "--format=%s%n%cI%n%aI", sha
        ).splitlines()
        assert event.data["commit"]["subject"] == subject
        assert event.data["commit"]["committed_at"] == date
        assert event.data["commit"]["authored_at"] == authored
    assert decided[-1].data["commit"]["approvers"] == ["Erin <erin@example.com>", "Dan"]


def test_a_commit_gitsched_cannot_read_is_rejected_by_sha_and_the_next_applies(
    bootstrapped: ClusterRepo,
):
    repo = bootstrapped
    gitsched("reconcile", "--once", repo.path, expect=0)
    tree = repo.head("HEAD^{tree}")
    parent = repo.head()
    # A commit object no git command would write: its author line has no e-mail or time.
    body = f"tree {tree}\nparent {parent}\nauthor Mallory\ncommitter Mallory\n\nbroken\n"
    broken = subprocess.run(
        ["git", "-C", str(repo.path), "hash-object", "-t", "commit", "--literally", "-w",
         "--stdin"],
        input=body.encode(),
        capture_output=True,
        check=True,
    ).stdout.decode().strip()  # fmt: skip
    git(repo.path, "update-ref", "refs/heads/main", broken)
    repo.write("teams/ml/jobs/after.yaml", job_yaml("after"))
    good = repo.commit("ml: after the broken commit")

    plan = gitsched("plan", repo.path, "HEAD", "--format", "json")
    assert plan.returncode in (0, 1), str(plan)
    run = gitsched("reconcile", "--once", repo.path)
    assert run.returncode == 0, str(run)
    assert broken[:12] in run.output
    events = read_events(repo.log_path)
    rejected = of_type(events, "CommitRejected")
    assert [e.data["commit"]["sha"] for e in rejected] == [broken]
    assert rejected[0].data["errors"][0]["code"] == "unreadable-commit"
    assert "author line" in rejected[0].data["errors"][0]["message"]
    applied = of_type(events, "CommitApplied")
    assert applied[-1].data["commit"]["sha"] == good


def test_trailers_of_many_commits_read_as_git_interpret_trailers_reads_each(
    bootstrapped: ClusterRepo,
):
    """Many commits' trailers come from one `git log -z`; each must be what
    `git interpret-trailers --parse` says of that commit alone."""
    repo = bootstrapped
    messages = [
        "folded\n\nApproved-by: Carol\n  <carol@example.com>\n",
        "cases\n\napproved-BY: dan@example.com\nREVIEWED-by: Erin\n",
        "not last\n\nApproved-by: nobody\n\nthe last paragraph is prose\n",
        "cherry\n\nApproved-by: Fay\n(cherry picked from commit abc)\n",
        "mixed\n\nSigned-off-by: Gus\nApproved-by: Hal\nApproved-by: Hal\nReviewed-by:\n",
        "only a subject that says Approved-by: Ivy",
    ]
    shas = [commit_raw(repo, m, "Ana") for m in messages]
    read = {c.sha: c.approvers for c in GitRepo(repo.path).commits(f"{shas[0]}^..HEAD")}
    assert read == {sha: git_approvers(repo, sha) for sha in shas}
    assert read[shas[0]] == ("Carol <carol@example.com>",)
    assert read[shas[2]] == ()
