"""Shared fixtures: a copy of the project per test, a real engine, real registries.

Tests that need the engine use the ``engine`` fixture: it fails (never skips) when CI is set
and no daemon answers. Every registry a test starts is stopped, every container removed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import copy_project, edit_matrix, free_port, run_builder

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")  # its reaper image can't be pulled here


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return copy_project(tmp_path / "project")


@pytest.fixture(scope="session")
def engine():
    """A docker-py client for a daemon that answers."""
    import docker

    try:
        client = docker.from_env(timeout=3600)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means no engine
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but no Docker engine answers ({exc}); .ci/run must start dockerd")
        pytest.skip(f"no Docker engine ({exc})")
    yield client
    client.close()


def _wait_http(url: str, timeout: float = 15) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return  # 401: up, wants credentials
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def start_registry(folder: Path, htpasswd: Path | None = None) -> tuple[str, subprocess.Popen]:
    """Start Debian's docker-registry on a free loopback port; return (host:port, process)."""
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.fail("docker-registry is not installed (apt-get install docker-registry); .ci/run installs it")
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    auth = (
        f"auth:\n  htpasswd:\n    realm: test\n    path: {htpasswd}\n" if htpasswd else ""
    )
    (folder / "config.yml").write_text(
        f"version: 0.1\nlog: {{level: error}}\nstorage:\n  filesystem: {{rootdirectory: {folder / 'data'}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n{auth}"
    )
    with open(folder / "log", "wb") as log:
        proc = subprocess.Popen([binary, "serve", str(folder / "config.yml")], stdout=subprocess.DEVNULL, stderr=log)
    _wait_http(f"http://127.0.0.1:{port}/v2/")
    return f"127.0.0.1:{port}", proc


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def registry(tmp_path_factory) -> Iterator[str]:
    """A plain registry on loopback, for the whole session."""
    host, proc = start_registry(tmp_path_factory.mktemp("registry"))
    yield host
    stop(proc)


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory) -> Iterator[tuple[str, str, str]]:
    """A registry with htpasswd auth; yields (host, user, password)."""
    folder = tmp_path_factory.mktemp("auth-registry")
    htpasswd = folder / "htpasswd"
    import bcrypt

    user, password = "ci-user", "s3cret-Pa55"
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()
    htpasswd.write_text(f"{user}:{hashed}\n")
    host, proc = start_registry(folder, htpasswd)
    yield host, user, password
    stop(proc)


@pytest.fixture(scope="session")
def based_project(tmp_path_factory, engine, registry) -> Iterator[Path]:
    """A project copy whose registry is the session's, with its base bootstrapped, pushed, pinned."""
    root = copy_project(tmp_path_factory.mktemp("based") / "project")
    edit_matrix(root, registry=f"{registry}/ml-runtime")
    (root / "base.lock.json").unlink(missing_ok=True)
    base = run_builder("base", cwd=root)
    assert base.returncode == 0, base.stderr + base.stdout
    yield root
    # Untag what this session pushed under its own registry (noprune: the build cache stays
    # for the next session; the images themselves are the same content as the repo's).
    for image in engine.images.list():
        for tag in image.tags:
            if tag.startswith(f"{registry}/"):
                engine.api.remove_image(tag, noprune=True)


@pytest.fixture(scope="session")
def cpu_project(based_project) -> Path:
    """``based_project`` with the cpu target built, smoke-tested and pushed.

    The base is reproducible, so on an engine that built it before every layer comes from cache.
    """
    root = based_project
    build = run_builder("build", "-t", "cpu", "--push", "--json", "-q", cwd=root)
    assert build.returncode == 0, build.stderr[-3000:] + build.stdout
    return root


@pytest.fixture
def no_leftovers(engine):
    """Fail a test that leaves containers behind."""
    before = {c.id for c in engine.containers.list(all=True)}
    yield
    after = {c.id for c in engine.containers.list(all=True)}
    left = after - before
    for cid in left:
        engine.api.remove_container(cid, force=True)
    assert not left, f"test left {len(left)} containers behind"
