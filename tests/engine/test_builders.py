"""Builds run on the buildx builder the user selects (``--builder NAME`` or ``BUILDX_BUILDER``).

The selection reaches buildx (an unknown builder is refused by buildx's own answer, in one line);
a real docker context of a second dockerd is a docker-driver builder that keeps what it builds in
its own engine: refused with the fix, before anything is built. A docker-container, remote or
Kubernetes builder can't be started here (no BuildKit image or buildkitd is reachable), so a
build on one is not exercised.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator

import pytest
from helpers import run_builder

from devtools.dockerd import DockerdUnavailable, extra_dockerd
from devtools.support import fail_or_skip

pytestmark = pytest.mark.engine


@contextlib.contextmanager
def docker_context(name: str, host: str) -> Iterator[str]:
    """A docker context (and so a docker-driver buildx builder of the same name) for the engine at *host*."""
    proc = subprocess.run(["docker", "context", "create", name, "--docker", f"host={host}"], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    try:
        yield name
    finally:
        subprocess.run(["docker", "context", "rm", "-f", name], capture_output=True, check=False)


def test_an_unknown_builder_is_one_line_before_anything_is_built(project):
    proc = run_builder("build", "-t", "cpu", "--builder", "no-such-builder", cwd=project)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "'no-such-builder' is unknown" in lines[0] and "docker buildx ls" in lines[0], lines


def test_a_docker_driver_builder_of_another_engine_is_refused_with_the_fix(project, tmp_path):
    try:
        with extra_dockerd(tmp_path / "engine2", "bx") as other, docker_context(f"mlb-other-{os.getpid()}",
                                                                                other) as name:
            proc = run_builder("build", "-t", "cpu", "--no-smoke", cwd=project, env={"BUILDX_BUILDER": name})
    except DockerdUnavailable as exc:
        fail_or_skip(str(exc))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"DOCKER_HOST={other}" in lines[0] and name in lines[0], lines
