"""The image scripts/image builds from deploy/Containerfile: gitsched runs in it as the
chart's pod runs it (its own non-root user, the root filesystem read-only, a fresh /tmp,
the cluster repo mounted read-only), and nothing to build or install software with is
left in it. The session builds the image from the working tree first (the base is
cached under .cache/image/), so the test checks the code it runs with."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.support.deploy_tools import ROOT

pytestmark = pytest.mark.image

SCRIPT = str(ROOT / "scripts" / "image")
GITSCHED = (sys.executable, "-m", "gitsched")  # the host's, for the demo repo and a comparison
# Above this the image has grown by something new (it is about 760 MB: a 210 MB Debian
# base with Python and git, the rest gitsched's dependencies, of which the kubernetes
# client is 126 MB and CP-SAT's ortools with the pandas it requires about 170 MB); look
# before raising it.
MAX_IMAGE_BYTES = 850_000_000


def _image(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCRIPT, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def image() -> Iterator[int]:
    """Build the image (minutes; the first time also the base, from Debian's mirror) and
    yield its size in bytes."""
    done = _image("build", timeout=1800)
    if done.returncode != 0:
        pytest.fail(
            "scripts/image build failed: this test needs root, buildah and mmdebstrap "
            f"(Debian packages) and Debian's mirror for the first base:\n{done.stderr[-3000:]}"
        )
    size = _image("size")
    assert size.returncode == 0, size.stderr
    yield int(size.stdout.strip())


@pytest.fixture(scope="module")
def demo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("image") / "demo"
    done = subprocess.run(
        [*GITSCHED, "demo", str(path)], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return path


@pytest.mark.timeout(2400)
def test_gitsched_runs_in_the_image_as_the_chart_runs_it(
    image: int, demo_repo: Path, record_property: Callable[[str, object], None]
) -> None:
    record_property("image_bytes", image)
    print(f"\nimage size: {image} bytes ({image // 1_000_000} MB)")
    assert image < MAX_IMAGE_BYTES

    done = _image("run", "--", "gitsched", "--version")
    assert done.returncode == 0, done.stderr
    assert version("gitsched") in done.stdout

    # The demo repo, mounted read-only where git-sync's clone is in the chart's pod.
    valid = _image("run", "-v", f"{demo_repo}:/repo", "--", "gitsched", "validate", "/repo")
    assert valid.returncode == 0, valid.stdout + valid.stderr
    # An earlier commit of the demo is invalid (its DEMO.md says which): git works in the
    # image, on a repo owned by another user, and the finding comes out as JSON.
    invalid = _image(
        "run",
        "-v",
        f"{demo_repo}:/repo",
        "--",
        "gitsched",
        "validate",
        "/repo",
        "--rev",
        "main~6",
        "--format",
        "json",
    )
    assert invalid.returncode == 1, invalid.stdout + invalid.stderr
    report = json.loads(invalid.stdout)
    assert report["valid"] is False
    host = subprocess.run(
        [*GITSCHED, "validate", str(demo_repo), "--rev", "main~6", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert report == json.loads(host.stdout)  # the image finds what the host's gitsched finds
    assert report["errors"]


@pytest.mark.timeout(2400)
def test_the_image_is_non_root_read_only_and_has_no_build_tools(image: int) -> None:
    done = _image(
        "run",
        "--",
        "sh",
        "-c",
        "id -u; touch /opt/x 2>/dev/null && echo root-writable; touch /tmp/x && echo tmp-writable; "
        "python3 -m pip --version >/dev/null 2>&1 && echo pip; python3 -m ensurepip --version "
        ">/dev/null 2>&1 && echo ensurepip; for t in gcc cc make apt-get-lists; do "
        'command -v "$t" >/dev/null && echo "$t"; done; ls /var/lib/apt/lists | grep -v "^lock$" '
        "| grep -v '^partial$' | head -1; ls /wheels 2>/dev/null && echo wheels; echo end",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["65532", "tmp-writable", "end"], done.stdout
