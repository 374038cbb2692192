"""Builds run on the buildx builder the user selects (``--builder NAME`` or ``BUILDX_BUILDER``).

Real docker contexts and buildx builders: one on this test's engine (builds, and the image is
there to smoke-test and push), one on a second dockerd (a docker-driver builder keeps what it
builds in its own engine: refused with the fix, before anything is built). A remote BuildKit or a
Kubernetes driver can't be started here (no buildkitd image or binary is reachable), so those
drivers are not exercised.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
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


def test_a_selected_builder_on_this_engine_builds(cpu_project, tmp_path):
    root = tmp_path / "p"
    shutil.copytree(cpu_project, root, ignore=shutil.ignore_patterns("dist"))
    with (root / "runtime" / "ml_runtime" / "__init__.py").open("a") as handle:
        handle.write("# built on a selected builder\n")
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    with docker_context(f"mlb-here-{os.getpid()}", host) as name:
        listed = subprocess.run(["docker", "buildx", "ls"], capture_output=True, text=True, check=False).stdout
        assert name in listed, listed
        proc = run_builder("build", "-t", "cpu", "--builder", name, "--no-smoke", "--json", "-q", cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (cpu,) = json.loads(proc.stdout)
    assert cpu["result"] == "built" and cpu["error"] is None, cpu
    assert 0 < cpu["cached_steps"] < cpu["steps"], "the shared stages come from that builder's cache"


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
