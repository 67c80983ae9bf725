"""`gitsched reconcile --once`: commits in, events out, exactly once, with who and why."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.support.cluster_repo import (
    ANA,
    LI,
    PRIYA,
    ClusterRepo,
    assert_chain_intact,
    finish,
    git,
    gitsched,
    job_yaml,
    of_type,
    queue_yaml,
    read_events,
    start_gitsched,
)


def test_first_run_applies_every_commit_and_a_second_run_appends_nothing(
    bootstrapped: ClusterRepo,
) -> None:
    shas = [bootstrapped.head()]
    for name in ("a", "b"):
        bootstrapped.write(f"teams/ml/jobs/{name}.yaml", job_yaml(name, gpu=4))
        shas.append(bootstrapped.commit(f"ml: job {name}", author=ANA))

    first = gitsched("reconcile", "--once", bootstrapped.path, expect=0)

    assert [line.split()[:2] for line in first.stdout.splitlines()[:3]] == [
        ["applied", sha[:12]] for sha in shas
    ]
    events = read_events(bootstrapped.log_path)
    assert_chain_intact(events)
    assert first.stdout.strip().endswith(
        f"{len(events)} event(s) appended; log at seq {events[-1].seq}"
    )
    assert [e.data["commit"]["sha"] for e in of_type(events, "CommitApplied")] == shas

    second = gitsched("reconcile", "--once", bootstrapped.path, expect=0)

    assert "up to date: no new commits" in second.stdout
    assert f"0 event(s) appended; log at seq {events[-1].seq}" in second.stdout
    assert read_events(bootstrapped.log_path) == events


def test_a_bad_commit_is_rejected_and_the_next_good_commit_applies_on_top(
    bootstrapped: ClusterRepo,
) -> None:
    bootstrapped.write("teams/ml/jobs/a.yaml", job_yaml("a", gpu=4))
    good = bootstrapped.commit("ml: job a", author=ANA)
    # One commit, three errors in two files, beside a valid quota change.
    bootstrapped.write("teams/ml/queue.yaml", queue_yaml(nominal=24))
    bootstrapped.write(
        "teams/ml/jobs/b.yaml",
        job_yaml("b").replace("replicas: 1", "replicas: two") + "  colour: red\n",
    )
    bootstrapped.write("teams/ml/jobs/c.yaml", job_yaml("c", queue="nope"))
    bad = bootstrapped.commit("ml: jobs b and c, quota 24", author=LI)
    bootstrapped.remove("teams/ml/jobs/c.yaml")
    bootstrapped.write("teams/ml/jobs/b.yaml", job_yaml("b", gpu=4))
    fixed = bootstrapped.commit("ml: fix job b, drop c", author=LI)

    run = gitsched("reconcile", "--once", bootstrapped.path, expect=0)

    lines = run.stdout.splitlines()
    assert lines[2] == f"REJECTED {bad[:12]} ml: jobs b and c, quota 24 (Li Wei): 3 error(s)"
    assert lines[3] == (
        "    teams/ml/jobs/b.yaml:6:3: $.spec.replicas: must be a whole number (found 'two')"
        " [schema]"
    )
    assert lines[4].startswith("    teams/ml/jobs/b.yaml:9:3: $.spec.colour: unknown field")
    assert lines[5].startswith("    teams/ml/jobs/c.yaml:8:3: $.spec.queue: job 'c' names queue")
    assert lines[6].startswith(f"applied  {fixed[:12]} ")

    events = read_events(bootstrapped.log_path)
    [rejected] = of_type(events, "CommitRejected")
    assert rejected.cause == bad
    assert [(e["file"], e["line"], e["path"]) for e in rejected.data["errors"]] == [
        ("teams/ml/jobs/b.yaml", 6, "$.spec.replicas"),
        ("teams/ml/jobs/b.yaml", 9, "$.spec.colour"),
        ("teams/ml/jobs/c.yaml", 8, "$.spec.queue"),
    ]

    at_rejection = gitsched(
        "state", "--repo", bootstrapped.path, "--seq", rejected.seq, "--format", "json", expect=0
    ).json()
    assert at_rejection["last_commit"] == bad
    assert at_rejection["last_good_commit"] == good
    assert at_rejection["queues"]["ml"]["quotas"]["h100-80g"]["nominal"] == 32
    assert set(at_rejection["placements"]) == {"ml/a"}
    assert len(at_rejection["last_rejection"]) == 3

    now = gitsched("state", "--repo", bootstrapped.path, "--format", "json", expect=0).json()
    assert now["last_good_commit"] == now["last_commit"] == fixed
    assert now["last_rejection"] == []
    assert now["queues"]["ml"]["quotas"]["h100-80g"]["nominal"] == 24
    assert set(now["placements"]) == {"ml/a", "ml/b"}


def test_approvers_and_causes_are_recorded(bootstrapped: ClusterRepo) -> None:
    bootstrapped.write("teams/ml/queue.yaml", queue_yaml(nominal=16))
    sha = bootstrapped.commit(
        "ml: quota 16",
        author=ANA,
        trailers=[
            ("Approved-by", "Li Wei <li@ml.example>"),
            ("Reviewed-by", "Priya Raman <priya@platform.example>"),
            ("Signed-off-by", "Ana Souza <ana@ml.example>"),
        ],
    )

    gitsched("reconcile", "--once", bootstrapped.path, expect=0)

    events = read_events(bootstrapped.log_path)
    mine = [e for e in events if e.cause == sha]
    applied = [e for e in mine if e.type == "CommitApplied"]
    assert len(applied) == 1
    assert applied[0].data["commit"]["approvers"] == [
        "Li Wei <li@ml.example>",
        "Priya Raman <priya@platform.example>",
    ]
    assert applied[0].data["commit"]["author_email"] == ANA[1]
    assert applied[0].data["commit"]["committed_at"] == "2025-11-16T10:00:00+00:00"
    by_commit = [e for e in mine if e.actor != "solver"]
    assert {e.actor for e in by_commit} == {
        "Ana Souza <ana@ml.example> (approved by Li Wei <li@ml.example>, "
        "Priya Raman <priya@platform.example>)"
    }
    assert {e.type for e in by_commit} >= {"QueueConfigured", "CommitApplied"}
    assert {e.type for e in mine if e.actor == "solver"} >= {"SolveCompleted"}
    assert all(e.id.startswith(f"{sha}/") for e in mine)
    bootstrap = [e for e in events if e.cause != sha]
    assert {e.cause for e in bootstrap} == {bootstrapped.head("HEAD~1")}
    assert {e.actor for e in bootstrap if e.actor != "solver"} == {f"{PRIYA[0]} <{PRIYA[1]}>"}


def test_exit_1_when_the_newest_commit_is_rejected(bootstrapped: ClusterRepo) -> None:
    bootstrapped.write("teams/ml/jobs/a.yaml", job_yaml("a", gpu=-1))
    bad = bootstrapped.commit("ml: negative GPUs", author=ANA)

    run = gitsched("reconcile", "--once", bootstrapped.path, expect=1)

    assert f"REJECTED {bad[:12]}" in run.stdout
    assert "teams/ml/jobs/a.yaml:7:" in run.stdout
    text = gitsched("state", "--repo", bootstrapped.path, expect=0).stdout
    assert f"newest commit {bad[:12]} was REJECTED with 1 error(s):" in text
    assert "  teams/ml/jobs/a.yaml:7:" in text


def test_rewritten_history_is_refused_and_nothing_is_appended(reconciled: ClusterRepo) -> None:
    before = read_events(reconciled.log_path)
    git(reconciled.path, "reset", "-q", "--hard", "HEAD~1")
    reconciled.write("teams/ml/jobs/other.yaml", job_yaml("other"))
    reconciled.commit("ml: another job instead", author=LI)

    run = gitsched("reconcile", "--once", reconciled.path, expect=2)

    assert run.stdout == ""
    assert "history was rewritten (force-push)" in run.stderr
    assert read_events(reconciled.log_path) == before


def test_a_log_from_another_repository_is_refused(reconciled: ClusterRepo, tmp_path: Path) -> None:
    other = ClusterRepo(tmp_path / "other")
    other.bootstrap()
    before = read_events(reconciled.log_path)

    run = gitsched(
        "reconcile", "--once", other.path, "--log", f"sqlite:///{reconciled.log_path}", expect=2
    )

    assert "is not in this repository" in run.stderr
    assert read_events(reconciled.log_path) == before
    assert not other.log_path.exists()


def test_log_url_from_option_and_environment(bootstrapped: ClusterRepo, tmp_path: Path) -> None:
    by_option = tmp_path / "logs" / "option.db"
    url = f"sqlite:///{by_option}"
    assert url.startswith("sqlite:////")
    run = gitsched("reconcile", "--once", bootstrapped.path, "--log", url, expect=0)
    assert not bootstrapped.log_path.exists(), "--log must replace the default log"
    events = read_events(by_option)
    assert run.stdout.strip().endswith(f"log at seq {events[-1].seq}")
    shown = gitsched("state", "--log", url, "--format", "json", expect=0)
    assert shown.json()["seq"] == events[-1].seq

    by_env = tmp_path / "logs" / "env.db"
    env = {"GITSCHED_LOG": f"sqlite:///{by_env}"}
    gitsched("reconcile", "--once", bootstrapped.path, env=env, expect=0)
    assert [e.id for e in read_events(by_env)] == [e.id for e in events]
    assert gitsched("state", "--format", "json", env=env, expect=0).json()["seq"] == len(events)
    verified = gitsched("audit", "verify", env=env, expect=0)
    assert verified.stdout.startswith(f"ok: {len(events)} events")
    assert not bootstrapped.log_path.exists()


def test_a_relative_sqlite_url_is_relative_to_the_working_directory(
    bootstrapped: ClusterRepo, tmp_path: Path
) -> None:
    gitsched(
        "reconcile",
        "--once",
        bootstrapped.path,
        "--log",
        "sqlite:///rel/log.db",
        cwd=tmp_path,
        expect=0,
    )
    assert (tmp_path / "rel" / "log.db").exists()
    assert read_events(tmp_path / "rel" / "log.db")


def test_reconcile_usage_errors(bootstrapped: ClusterRepo, tmp_path: Path) -> None:
    unknown = gitsched("reconcile", "--once", bootstrapped.path, "--branch", "nope", expect=2)
    assert "unknown revision 'nope'" in unknown.stderr
    plain = tmp_path / "plain"
    plain.mkdir()
    assert "not a git repository" in gitsched("reconcile", "--once", plain, expect=2).stderr
    empty = ClusterRepo(tmp_path / "empty")
    assert "unknown revision 'main'" in gitsched("reconcile", "--once", empty.path, expect=2).stderr
    bad_url = gitsched("reconcile", "--once", bootstrapped.path, "--log", "mysql://x/y", expect=2)
    assert "unknown log URL" in bad_url.stderr


def test_a_reconciler_that_crashed_before_its_solve_resumes_exactly(
    bootstrapped: ClusterRepo, tmp_path: Path
) -> None:
    for name in ("a", "b", "c"):
        bootstrapped.write(f"teams/ml/jobs/{name}.yaml", job_yaml(name, replicas=2, gpu=4))
        bootstrapped.commit(f"ml: job {name}", author=ANA)
    clean = bootstrapped.copy_to(tmp_path / "clean")
    gitsched("reconcile", "--once", clean.path, expect=0)
    clean_ids = [e.id for e in read_events(clean.log_path)]
    # The crash: job b's commit is in the log, the solve that should follow it is not.
    gitsched("reconcile", "--once", bootstrapped.path, "--branch", "HEAD~1", expect=0)
    events = read_events(bootstrapped.log_path)
    [b_applied] = [e for e in of_type(events, "CommitApplied") if "job b" in str(e.data)]
    db = sqlite3.connect(bootstrapped.log_path)
    with db:
        db.execute("DELETE FROM events WHERE seq > ?", (b_applied.seq,))
    db.close()

    run = gitsched("reconcile", "--once", bootstrapped.path, expect=0)

    assert run.stdout.startswith(f"applied  {bootstrapped.head()[:12]} ml: job c")
    resumed = read_events(bootstrapped.log_path)
    assert_chain_intact(resumed)
    assert [e.id for e in resumed] == clean_ids


HIGHS_POLICY_YAML = (
    "apiVersion: gitsched.io/v1\nkind: Policy\nmetadata:\n  name: default\n"
    "spec:\n  solver: {name: highs, timeLimitSeconds: 20, gapTolerance: 0}\n"
)


def test_a_watching_reconciler_reads_only_what_is_new_and_places_new_jobs_alone(
    bootstrapped: ClusterRepo,
) -> None:
    from gitsched.eventlog.replay import replay
    from gitsched.eventlog.sqlite import SQLiteEventLog
    from gitsched.reconciler.git import GitRepo
    from gitsched.reconciler.loop import Reconciler

    bootstrapped.write("policies/default.yaml", HIGHS_POLICY_YAML)
    for name in ("a", "b", "c"):
        bootstrapped.write(f"teams/ml/jobs/{name}.yaml", job_yaml(name))
    # 3 x 8 GPUs in one NVLink domain of 2 nodes: it waits, whatever else runs.
    bootstrapped.write("teams/ml/jobs/big.yaml", job_yaml("big", replicas=3, topology="nvlink"))
    bootstrapped.commit("ml: three jobs and a gang too big for a domain", author=ANA)
    log = SQLiteEventLog(bootstrapped.log_path)
    reads: list[int] = []
    real_read = log.read

    def read(after_seq: int = 0, **kw):  # type: ignore[no-untyped-def]
        reads.append(after_seq)
        return real_read(after_seq, **kw)

    log.read = read  # type: ignore[method-assign]
    reconciler = Reconciler(GitRepo(bootstrapped.path), log)
    first = reconciler.run_once()
    assert set(first.state.placements) == {"ml/a", "ml/b", "ml/c"}
    assert set(first.state.pending) == {"ml/big"}
    placed_at = dict(first.state.placements)

    bootstrapped.write("teams/ml/jobs/d.yaml", job_yaml("d", gpu=4))
    bootstrapped.commit("ml: job d", author=ANA)
    reads.clear()
    second = reconciler.run_once()

    assert reads == [first.last_seq]  # the tip is carried on, not replayed from seq 0
    new = list(real_read(first.last_seq))
    assert [e.type for e in new] == [
        "JobSubmitted",
        "CommitApplied",
        "PlacementDecided",
        "SolveCompleted",
    ]
    assert new[2].data["job"] == "ml/d"
    # Only d was decided: the running jobs stay put and `big` keeps its reason.
    assert {k: second.state.placements[k] for k in placed_at} == placed_at
    assert second.state.pending["ml/big"] == first.state.pending["ml/big"]
    assert replay(log).state == second.state
    log.close()


def test_a_spec_cache_reads_only_changed_files_and_loads_what_a_fresh_read_loads(
    bootstrapped: ClusterRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gitsched import schemas
    from gitsched.reconciler.git import GitRepo
    from gitsched.reconciler.specs import SpecCache, load_commit

    for name in ("a", "b", "c"):
        bootstrapped.write(f"teams/ml/jobs/{name}.yaml", job_yaml(name))
    bootstrapped.write("teams/ml/jobs/broken.yaml", "kind: Job\nspec: [unclosed\n")
    first = bootstrapped.commit("ml: three jobs and a broken file", author=ANA)
    bootstrapped.write("teams/ml/jobs/b.yaml", job_yaml("b", gpu=4))
    bootstrapped.remove("teams/ml/jobs/broken.yaml")
    second = bootstrapped.commit("ml: b smaller, broken file gone", author=ANA)
    repo = GitRepo(bootstrapped.path)

    parsed: list[str] = []
    real_parse = schemas.parse_documents

    def parse_documents(content, path, limits):  # type: ignore[no-untyped-def]
        parsed.append(path)
        return real_parse(content, path, limits)

    monkeypatch.setattr(schemas, "parse_documents", parse_documents)
    cache = SpecCache()
    cached_first = load_commit(repo, first, cache=cache)
    assert "teams/ml/jobs/broken.yaml" in parsed and cached_first.desired is None
    parsed.clear()
    again = load_commit(repo, first, cache=cache)
    assert parsed == []  # nothing changed: nothing parsed, the same errors
    assert again.errors == cached_first.errors
    cached_second = load_commit(repo, second, cache=cache)
    assert parsed == ["teams/ml/jobs/b.yaml"]

    fresh_first, fresh_second = load_commit(repo, first), load_commit(repo, second)
    assert cached_first == fresh_first and cached_second == fresh_second
    assert cached_second.desired is not None
    assert cached_second.desired.jobs["ml/b"].resources.gpu_milli == 4000


def test_a_spec_cache_keeps_the_models_of_unchanged_documents_and_rebuilds_the_rest(
    bootstrapped: ClusterRepo,
) -> None:
    from gitsched.reconciler.git import GitRepo
    from gitsched.reconciler.specs import SpecCache, load_commit
    from tests.support.cluster_repo import CLUSTER_YAML

    for name in ("a", "b"):
        bootstrapped.write(f"teams/ml/jobs/{name}.yaml", job_yaml(name))
    first = bootstrapped.commit("ml: two jobs", author=ANA)
    bootstrapped.write("teams/ml/jobs/b.yaml", job_yaml("b", gpu=4))
    second = bootstrapped.commit("ml: b smaller", author=ANA)
    bootstrapped.write("cluster.yaml", CLUSTER_YAML.replace("value: 500", "value: 600"))
    third = bootstrapped.commit("normal jobs rank higher", author=ANA)
    repo = GitRepo(bootstrapped.path)

    cache = SpecCache()
    one, two, three = (
        load_commit(repo, sha, cache=cache).desired for sha in (first, second, third)
    )
    assert one is not None and two is not None and three is not None
    # Unchanged files: the very models of the commit before; the edited one: a new model.
    assert two.cluster is one.cluster and two.jobs["ml/a"] is one.jobs["ml/a"]
    assert all(two.nodes[n] is one.nodes[n] for n in one.nodes)
    assert two.jobs["ml/b"].resources.gpu_milli == 4000
    # A job's model depends on the cluster's priority classes too: rebuilt when they change.
    assert three.jobs["ml/a"] is not two.jobs["ml/a"] and three.jobs["ml/a"].priority == 600
    assert all(three.nodes[n] is two.nodes[n] for n in two.nodes)
    # And each is what a fresh read builds.
    assert [one, two, three] == [load_commit(repo, sha).desired for sha in (first, second, third)]


def test_a_spec_cache_reads_a_commit_as_the_difference_from_the_last_and_loads_what_a_fresh_read_loads(
    bootstrapped: ClusterRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gitsched import schemas
    from gitsched.reconciler.git import GitRepo
    from gitsched.reconciler.specs import SpecCache, load_commit, read_commit

    shas = [bootstrapped.head()]
    for name in ("a", "b", "c"):
        bootstrapped.write(f"teams/ml/jobs/{name}.yaml", job_yaml(name))
    bootstrapped.write("README.md", "not a spec file\n")
    shas.append(bootstrapped.commit("ml: three jobs", author=ANA))
    bootstrapped.write("teams/ml/jobs/b.yaml", job_yaml("b", gpu=4))  # edited
    bootstrapped.remove("teams/ml/jobs/c.yaml")  # removed
    bootstrapped.write("teams/ml/jobs/d[1]*.yaml", job_yaml("d"))  # a name git would glob
    bootstrapped.write("teams/ml/jobs/big.yaml", "# " + "x" * (1 << 20) + "\n")  # too large
    shas.append(bootstrapped.commit("ml: b smaller, c gone, d, a large file", author=ANA))
    bootstrapped.remove("teams/ml/jobs/a.yaml")
    bootstrapped.write("teams/ml/jobs/a.yaml/inner.yaml", job_yaml("a"))  # a file, now a folder
    bootstrapped.symlink("teams/ml/jobs/e.yaml", "b.yaml")  # a link
    bootstrapped.remove("teams/ml/jobs/big.yaml")
    shas.append(bootstrapped.commit("ml: a moved into a folder, e links to b", author=ANA))
    repo = GitRepo(bootstrapped.path)

    listed: list[object] = []
    real_tree = GitRepo.tree

    def tree(self: GitRepo, rev: str, paths: object = None) -> object:
        listed.append(paths)
        return real_tree(self, rev, paths)  # type: ignore[arg-type]

    monkeypatch.setattr(GitRepo, "tree", tree)
    cache = SpecCache()
    # Forward, back, forward again, the same one twice: each as a difference from the last.
    for sha in (*shas, shas[1], shas[3], shas[3], shas[0]):
        assert read_commit(repo, sha, cache=cache) == read_commit(repo, sha)
        assert load_commit(repo, sha, cache=cache) == load_commit(repo, sha)
    # A name may move: read in full; the commit read last (shas[0]) stays the base.
    assert read_commit(repo, "main", cache=cache) == read_commit(repo, shas[3])
    listed.clear()
    read_commit(repo, shas[2], cache=cache)
    assert len(listed) == 1  # only the paths that differ from the base are listed
    assert sorted(listed[0]) == [  # type: ignore[arg-type]
        "README.md",
        "teams/ml/jobs/a.yaml",
        "teams/ml/jobs/b.yaml",
        "teams/ml/jobs/big.yaml",
        "teams/ml/jobs/d[1]*.yaml",
    ]
    # Listed in full (by a name), a file the same as at its path last time is not parsed again.
    load_commit(repo, shas[3], cache=cache)
    parsed: list[str] = []
    real_parse = schemas.parse_documents

    def parse_documents(content, path, limits):  # type: ignore[no-untyped-def]
        parsed.append(path)
        return real_parse(content, path, limits)

    monkeypatch.setattr(schemas, "parse_documents", parse_documents)
    by_name = load_commit(repo, "main", cache=cache)
    assert parsed == []
    assert by_name == load_commit(repo, shas[3])


def test_a_commit_records_author_date_and_committer_and_is_decided_at_its_committer_date(
    bootstrapped: ClusterRepo,
) -> None:
    # Written on Monday by Ana in UTC+2, merged on Wednesday by Priya in UTC-5, reconciled now.
    bootstrapped.write("teams/ml/jobs/late.yaml", job_yaml("late", gpu=4))
    git(bootstrapped.path, "add", "-A")
    git(
        bootstrapped.path,
        "commit",
        "-q",
        "--no-verify",
        "-m",
        "ml: job late",
        env={
            "GIT_AUTHOR_NAME": ANA[0],
            "GIT_AUTHOR_EMAIL": ANA[1],
            "GIT_AUTHOR_DATE": "2025-11-17T09:30:00+02:00",
            "GIT_COMMITTER_NAME": PRIYA[0],
            "GIT_COMMITTER_EMAIL": PRIYA[1],
            "GIT_COMMITTER_DATE": "2025-11-19T07:15:00-05:00",
        },
    )
    sha = bootstrapped.head()

    gitsched("reconcile", "--once", bootstrapped.path, expect=0)

    mine = [e for e in read_events(bootstrapped.log_path) if e.cause == sha]
    (applied,) = of_type(mine, "CommitApplied")
    assert applied.schema_version == 2
    commit = applied.data["commit"]
    assert (commit["author"], commit["authored_at"]) == (ANA[0], "2025-11-17T09:30:00+02:00")
    assert (commit["committer"], commit["committer_email"]) == PRIYA
    assert commit["committed_at"] == "2025-11-19T07:15:00-05:00"
    (placed,) = of_type(mine, "PlacementDecided")
    # The decision's time is the commit's, in UTC: not the reconciler's clock.
    assert placed.data["at"] == "2025-11-19T12:15:00.000000Z"
    (submitted,) = of_type(mine, "JobSubmitted")
    assert submitted.data["job"]["submitted_at"] == "2025-11-19T07:15:00-05:00"
    assert applied.time != placed.data["at"]  # the envelope keeps when it was appended


def test_an_idle_watcher_says_it_is_alive(bootstrapped: ClusterRepo) -> None:
    import signal

    args = ("reconcile", bootstrapped.path, "--interval", "0.1", "--heartbeat", "0.3")
    process = start_gitsched(*args)
    assert process.stdout is not None
    lines = []
    for line in process.stdout:  # the first heartbeat comes after the first pass's report
        lines.append(line)
        if "watching main: no new commits" in line:
            break
    process.send_signal(signal.SIGTERM)
    run = finish(process, args)
    assert run.returncode == 0, run
    assert lines[0].startswith(f"applied  {bootstrapped.head()[:12]}")
    heartbeat = lines[-1]
    assert f"at {bootstrapped.head()[:12]}, log seq " in heartbeat, heartbeat


def test_a_master_branch_gets_a_hint_about_branch(bootstrapped: ClusterRepo) -> None:
    git(bootstrapped.path, "branch", "-m", "main", "master")
    run = gitsched("reconcile", "--once", bootstrapped.path, expect=2)
    assert run.stderr == (
        f"gitsched: unknown revision 'main' in {bootstrapped.path}: no such branch; its"
        " checked-out branch is 'master': pass --branch master\n"
    )
    assert not bootstrapped.log_path.exists()
    gitsched("reconcile", "--once", bootstrapped.path, "--branch", "master", expect=0)
