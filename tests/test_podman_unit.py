"""podman's version switches and the buildah bridge, without podman: what :class:`PodmanEngine` asks of buildah
and of ``podman push`` on each release (4.3.1 is Debian 12's, 5.4.2 Debian 13's; both were run for real:
tests/engine/test_podman.py, docs/building.md)."""

from __future__ import annotations

import subprocess
import typing
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from builder.oci import buildah, connect
from builder.oci import podman as engine
from builder.oci.engine import BuildRequest, BuildResult


def podman(version: str) -> engine.PodmanEngine:
    found = engine.PodmanEngine(mock.MagicMock(), "unix:///nonexistent")
    found.version = lambda: version  # type: ignore[method-assign]
    return found


def built_with(version: str, *, no_cache: bool = False) -> dict[str, Any]:
    """What :meth:`PodmanEngine.build` hands :func:`buildah.run` on podman *version*."""
    seen: dict[str, Any] = {}

    def run(request: BuildRequest, **kwargs: Any) -> BuildResult:
        seen.update(kwargs, request=request)
        return BuildResult(("sha256:" + "a" * 64,), 1, 0)

    found = podman(version)
    with mock.patch.object(buildah, "run", run), mock.patch.object(found, "resolve", lambda ids: ids[0]):
        found.build(BuildRequest(dockerfile="Dockerfile", context=".", platform="linux/amd64", no_cache=no_cache))
    return seen


@pytest.mark.parametrize(("version", "no_cache", "per_run_network"), [
    ("4.3.1", True, False), ("4.5.0", True, True), ("4.9.4", True, True), ("5.0.0", False, True),
    ("5.4.2", False, True)])
def test_the_layer_cache_is_off_below_podman_5_only(version: str, no_cache: bool, per_run_network: bool) -> None:
    """buildah 1.28 (podman 4.3.1) mounted nothing for ``RUN --mount=from=<stage>`` when the stage came from its
    cache, so builds there run with --no-cache; 5.4.2 (buildah 1.39.3) ran the second build of a changed target
    (a package added, then a runtime file changed) with the cache on: the stage from the cache was mounted, and a
    changed bind-mounted folder was not taken from the cache."""
    seen = built_with(version)
    assert seen["request"].no_cache is no_cache
    assert seen["per_run_network"] is per_run_network
    assert built_with(version, no_cache=True)["request"].no_cache, "--rebuild is --no-cache on every release"


@pytest.mark.parametrize(("version", "forced"), [("4.3.1", False), ("4.6.2", False), ("4.7.0", True), ("5.4.2", True)])
def test_push_forces_the_compression_from_podman_4_7(version: str, forced: bool) -> None:
    """``--force-compression`` (4.7) recompresses a layer the registry holds in another compression (the base's,
    pushed gzip): on 5.4.2 every layer of the cpu image came out zstd from podman's own push."""
    found = podman(version)
    calls: list[list[str]] = []

    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        Path(argv[argv.index("--digestfile") + 1]).write_text("sha256:" + "b" * 64)
        return subprocess.CompletedProcess(argv, 0, "", "")

    with mock.patch.object(engine.subprocess, "run", run), \
            mock.patch.object(engine.registry, "credentials", lambda host: None), \
            mock.patch.object(engine.registry, "manifest_digest", lambda ref, creds: "sha256:" + "b" * 64), \
            mock.patch.object(engine, "recompress", lambda ref, compression, creds: None), \
            mock.patch.object(found, "image", lambda ref: None):
        found.push("localhost:5077/ml-runtime:cpu", "zstd")
    (argv,) = calls
    assert ("--force-compression" in argv) is forced
    assert argv[argv.index("--compression-format") + 1] == "zstd" and argv[argv.index("--format") + 1] == "oci"


def test_podman_release_is_asked_once() -> None:
    found = podman("5.4.2")
    asked = mock.Mock(return_value="5.4.2")
    found.version = asked  # type: ignore[method-assign]
    assert found.release() == (5, 4) and found.release() == (5, 4) and found.forces_compression()
    assert asked.call_count == 1


def test_a_gpu_request_podman_cannot_honour_is_refused_not_dropped() -> None:
    """podman 4.3.1's compatible API takes docker's ``--gpus`` request (a ``DeviceRequest`` of capability gpu) and
    starts the container without the GPUs (tried: it exits 0); the CLI has no form for it. Either way the request
    is refused with the fix, before the engine is asked; a CDI name goes to the CLI as ``--device``."""
    import docker

    found = podman("4.3.1")
    gpus = {"image": "i", "command": ["true"],
            "device_requests": [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]}
    with pytest.raises(engine.EngineError, match="nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml"):
        found.create(gpus)
    assert not typing.cast(mock.MagicMock, found.api).mock_calls, "the engine was asked"
    with pytest.raises(engine.EngineError, match="podman names GPUs by CDI only"):
        connect.run_argv("podman", gpus)
    cdi = {**gpus, "device_requests": [docker.types.DeviceRequest(driver="cdi", device_ids=["nvidia.com/gpu=all"])]}
    assert connect.run_argv("podman", cdi)[-4:] == ["--device", "nvidia.com/gpu=all", "i", "true"]
    assert connect.run_argv("docker", gpus) == ["docker", "run", "--rm", "--gpus", "all", "i", "true"]


def test_podman_speaks_in_its_own_words() -> None:
    """podman's refusals name podman's commands and variables, never Docker's (podman users were asked "is
    DOCKER_HOST the engine buildx builds on?")."""
    from builder.oci.engine import ImageUnknown, PushFailed

    found = podman("5.4.2")
    with mock.patch.object(found, "image", lambda ref: None), pytest.raises(ImageUnknown) as unknown:
        found.resolve(["sha256:" + "a" * 64])
    assert "podman at unix:///nonexistent" in str(unknown.value) and "DOCKER" not in str(unknown.value)

    def refused(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 125, "", "Error: unauthorized: authentication required\n")

    with mock.patch.object(engine.subprocess, "run", refused), \
            mock.patch.object(engine.registry, "credentials", lambda host: None), pytest.raises(PushFailed) as push:
        found.push("registry.example/ml-runtime:cpu", "zstd")
    assert "log in with 'podman login registry.example'" in str(push.value) and "docker" not in str(push.value)
