"""`pip install gitsched` adds exactly one top-level name to site-packages (issue 28 item 2).

The wheel is built from this checkout and installed, without its dependencies, into an
empty virtualenv; what appeared in that venv's site-packages is then compared with what
an empty venv holds.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _site_packages(env: Path) -> Path:
    purelib = sysconfig.get_path(
        "purelib", vars={"base": str(env), "platbase": str(env)}, scheme="venv"
    )
    return Path(purelib)


def _sources(into: Path) -> Path:
    """The checkout's files as git sees them (tracked, and new ones not ignored), copied:
    a build in the checkout would reuse its build/ folder, stale modules and all."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return into


def test_the_wheel_adds_one_top_level_name(tmp_path: Path) -> None:
    source = _sources(tmp_path / "src")
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(wheels),
            str(source),
        ],
        check=True,
        timeout=600,
    )
    (wheel,) = wheels.glob("gitsched-*.whl")

    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    site = _site_packages(env)
    before = {p.name for p in site.iterdir()}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(env / "bin" / "python"),
            "install",
            "--no-deps",
            "-q",
            str(wheel),
        ],
        check=True,
        timeout=600,
    )
    added = {p.name for p in site.iterdir()} - before
    top_level = {n for n in added if not n.endswith(".dist-info") and n != "__pycache__"}
    assert top_level == {"gitsched"}, sorted(added)
    (dist_info,) = [n for n in added if n.endswith(".dist-info")]
    assert dist_info.startswith("gitsched-")

    # Its data files came along.
    installed = site / "gitsched"
    assert (installed / "schemas" / "job.schema.json").is_file()
    assert (installed / "policies" / "library" / "default.yaml").is_file()
    # It imports from the venv alone (no checkout on the path): `findings` needs no
    # third-party library, so it loads with the dependencies left out.
    probe = subprocess.run(
        [
            str(env / "bin" / "python"),
            "-I",
            "-c",
            "import gitsched.findings as f; print(f.__file__)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert Path(probe.stdout.strip()).is_relative_to(installed)
