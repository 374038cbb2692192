"""Shared fixtures: a copy of the project per test, a real engine, real registries.

Tests that need the engine use the ``engine`` fixture: it fails (never skips) when CI is set
and no daemon answers. Every registry a test starts is stopped, every container removed.

The session has a Docker config of its own (``DOCKER_CONFIG``): the session registry's login goes
there, as ``docker login`` would write it, never into the user's. Every process the tests start (the
builder, buildx, cosign, oras, skopeo, podman) reads it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import forget_engines, registry_folders, remove_lock_only_folders, run_builder

from devtools import dockerd
from devtools.support import (
    copy_project,
    docker_config,
    docker_login,
    edit_matrix,
    fail_or_skip,
    native_only,
    registry_login,
    start_registry,
    stop,
)

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")  # its reaper image can't be pulled here

_DOCKER_CONFIG = docker_config(Path(tempfile.mkdtemp(prefix="tests-docker-config-")))
os.environ["DOCKER_CONFIG"] = str(_DOCKER_CONFIG)
atexit.register(shutil.rmtree, _DOCKER_CONFIG, True)

# Ctrl-C as a terminal delivers it, even when the suite was started with SIGINT ignored (a shell's
# background job, some CI runners): the interrupt tests send it to this process and to the builder
# processes they start, which inherit the default once a handler is set here.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def _no_state_of_removed_engines() -> Iterator[None]:
    """The builder records what it makes in the user's state (~/.cache/ml-image-builder): the
    ledgers of the engines this session started and removed go with them, and so do the registry
    folders it made for the session's own registries (a lock, nothing more)."""
    before = registry_folders()
    yield
    forget_engines({*dockerd.STARTED, *filter(None, [os.environ.get(dockerd.THROWAWAY_ENV)])})
    remove_lock_only_folders(before)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return copy_project(tmp_path / "project")


@pytest.fixture(scope="session")
def engine():
    """The engine the builder uses (:class:`builder.oci.docker.DockerEngine`; its docker-py client is
    ``engine.client``, for what a test inspects beside the builder); fails (never skips) when CI is set
    and none answers."""
    from builder.oci.docker import DockerEngine

    try:
        found = DockerEngine.from_env(timeout=3600)
        found.client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means no engine
        fail_or_skip(f"no Docker engine answers ({exc}); .ci/run must start dockerd")
    yield found
    found.close()


def _start_registry(folder: Path, htpasswd: Path | None = None) -> tuple[str, subprocess.Popen]:
    try:
        return start_registry(folder, htpasswd)
    except FileNotFoundError as exc:
        pytest.fail(f"{exc}; .ci/run installs it")


@pytest.fixture(scope="session")
def registry(tmp_path_factory) -> Iterator[str]:
    """A registry on loopback that takes no request without its login, for the whole session; the
    session's Docker config holds the login (a ``docker login``): a loopback registry the builder did
    not start must take a login it holds (builder.oci.localregistry.check)."""
    folder = tmp_path_factory.mktemp("registry")
    user, password, htpasswd = registry_login(folder)
    host, proc = _start_registry(folder, htpasswd)
    docker_login(_DOCKER_CONFIG, host, user, password)
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
    host, proc = _start_registry(folder, htpasswd)
    yield host, user, password
    stop(proc)


@pytest.fixture(scope="session")
def based_project(tmp_path_factory, engine, registry) -> Iterator[Path]:
    """A project copy whose registry is the session's, every target on this host's platform only,
    with its base bootstrapped, pushed, pinned."""
    root = copy_project(tmp_path_factory.mktemp("based") / "project")
    edit_matrix(root, registry=f"{registry}/ml-runtime")
    native_only(root)
    (root / "base.lock.json").unlink(missing_ok=True)
    base = run_builder("base", cwd=root)
    assert base.returncode == 0, base.stderr + base.stdout
    yield root
    # Untag what this session pushed under its own registry (noprune: the build cache stays
    # for the next session; the images themselves are the same content as the repo's).
    # A tag whose image another job's container uses (a shared engine) stays: the engine refuses (409).
    import docker

    for image in engine.client.api.images():  # the list alone: an image another job removes meanwhile is no error
        for tag in image.get("RepoTags") or ():
            if tag.startswith(f"{registry}/"):
                try:
                    engine.client.api.remove_image(tag, noprune=True)
                except docker.errors.APIError as exc:
                    if exc.status_code != 409:
                        raise


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
    """Fail a test that leaves containers behind (and remove them). The engine may be shared: a smoke
    container whose builder run is still live (another clone's build, another job's) is not this
    test's, and is never touched; the builder's own rule (:func:`builder.config.ownership.run_state`)."""
    from builder.config.ownership import run_state
    from builder.images.smoke import SMOKE_LABEL

    def others(container) -> bool:
        token = (container.labels or {}).get(SMOKE_LABEL)
        return token is not None and run_state(token) != "gone"

    before = {c.id for c in engine.client.containers.list(all=True)}
    yield
    left = [c.id for c in engine.client.containers.list(all=True) if c.id not in before and not others(c)]
    for cid in left:
        engine.client.api.remove_container(cid, force=True)
    assert not left, f"test left {len(left)} containers behind"


@pytest.fixture(scope="session")
def signing_key(tmp_path_factory) -> dict[str, Path]:
    """A cosign key pair (ECDSA P-256, PKCS#8 PEM, unencrypted) in files: {"private": ..., "public": ...}."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    folder = tmp_path_factory.mktemp("signing")
    key = ec.generate_private_key(ec.SECP256R1())
    (folder / "cosign.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (folder / "cosign.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return {"private": folder / "cosign.key", "public": folder / "cosign.pub"}
