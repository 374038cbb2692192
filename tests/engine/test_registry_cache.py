"""Cache across runners: a second, empty engine rebuilds the published image from registry cache alone.

Runner A is the main engine: it builds and pushes cpu from a copy of ``cpu_project`` with its
own repository. Runner B is a second ``dockerd`` started here with its own data root and socket:
it has nothing local; BuildKit reads the published image's inline cache from the registry, and
must not run a single step.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from helpers import publish_base_to, run_builder

from devtools.dockerd import DockerdUnavailable, _stop, extra_dockerd
from devtools.support import edit_matrix, fail_or_skip

pytestmark = pytest.mark.engine


@pytest.fixture(scope="session")
def second_engine(engine, tmp_path_factory) -> Iterator[str]:
    """A second dockerd with an empty store and a bridge of its own (devtools/dockerd.py); yields DOCKER_HOST."""
    try:  # the main engine's image store: image IDs compare only within one store
        with extra_dockerd(tmp_path_factory.mktemp("dockerd2"), "d2", store=engine.store()) as host:
            yield host
    except DockerdUnavailable as exc:
        fail_or_skip(str(exc))


def _own_copy(based: Path, engine: docker.DockerClient, dest: Path) -> tuple[Path, str]:
    """A copy of *based* with its own repository (other tests' tags stay untouched); returns (root, repository)."""
    shutil.copytree(based, dest, ignore=shutil.ignore_patterns("dist"))
    registry = json.loads(run_builder("print", cwd=based).stdout)["registry"]
    repo = registry + "-runners"
    edit_matrix(dest, registry=repo)
    publish_base_to(engine, dest, dest, repo)  # same layers, same digest: the pin holds for this repository
    return dest, repo


def test_second_runner_runs_no_step(cpu_project, engine, second_engine, tmp_path):
    root, repo = _own_copy(cpu_project, engine, tmp_path / "p")
    client = docker.DockerClient(base_url=second_engine, timeout=3600)
    try:
        first = run_builder("build", "-t", "cpu", "--push", "--json", "--no-smoke", "-q", cwd=root)
        assert first.returncode == 0, first.stderr[-3000:] + first.stdout
        runner_a = json.loads(first.stdout)[0]["image_id"]
        assert client.images.list(all=True) == [], "runner B must start with an empty store"
        proc = run_builder("build", "-t", "cpu", "--json", "--no-smoke", "-q", cwd=root,
                           env={"DOCKER_HOST": second_engine})
        assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout
        cpu = json.loads(proc.stdout)[0]
        assert cpu["error"] is None, cpu
        assert cpu["steps"] > 0 and cpu["cached_steps"] == cpu["steps"], cpu
        assert cpu["image_id"] == runner_a, "runner B should end with runner A's very image"
        cold = _cold_build_seconds(second_engine, root)
        print(f"\nrunner B from registry cache: {cpu['seconds']:.1f} s (pull included); "
              f"cold build on the same engine: {cold:.1f} s")
    finally:
        client.close()
        for image in engine.client.images.list(name=repo):
            for tag in image.tags:  # the same image may carry other tests' tags: only ours go
                if tag.startswith(repo + ":"):
                    engine.client.api.remove_image(tag, noprune=True)


def _cold_build_seconds(second_engine: str, root: Path) -> float:
    """For the record: the same target built on runner B without any cache."""
    proc = run_builder("build", "-t", "cpu", "--rebuild", "--json", "--no-smoke", "-q", cwd=root,
                       env={"DOCKER_HOST": second_engine})
    assert proc.returncode == 0, proc.stderr[-3000:]
    cold = json.loads(proc.stdout)[0]
    assert cold["cached_steps"] < cold["steps"]  # it really was cold
    return float(cold["seconds"])


def test_daemon_helpers_only_touch_their_own_pid(tmp_path):
    """The second engine's stop signals the pid it was given and removes only its own folders."""
    proc = subprocess.Popen(["sleep", "60"])
    pidfile = tmp_path / "pid"
    pidfile.write_text(str(proc.pid))
    folders = [tmp_path / "root", tmp_path / "short"]
    for f in folders:
        (f / "x").mkdir(parents=True)
    keep = tmp_path / "keep"
    keep.mkdir()
    _stop(proc, pidfile, folders, [])
    assert proc.returncode == -signal.SIGTERM
    assert not any(f.exists() for f in folders) and keep.exists()
