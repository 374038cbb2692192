"""podman's version switches and the buildah bridge, without podman: what :class:`PodmanEngine` asks of buildah
and of ``podman push`` on each release (4.3.1 is Debian 12's, 5.4.2 Debian 13's; both were run for real:
tests/engine/test_podman.py, docs/building.md), and the refusal that keeps buildah from emptying a folder of the
project."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from builder.config.errors import TargetFailed
from builder.oci import buildah, engine
from builder.oci.buildkit import BuildRequest, BuildResult

#: A Dockerfile like the rendered ones: a writable bind mount of the project's runtime/.
RW_DOCKERFILE = "FROM x\nRUN --network=none --mount=type=bind,source=runtime,target=/tmp/runtime,rw true\n"
OVERLAY_ROOT = "22 1 0:21 / / rw,relatime - overlay overlay rw,lowerdir=/a,upperdir=/b,workdir=/c\n"


def podman(version: str) -> engine.PodmanEngine:
    found = engine.PodmanEngine(mock.MagicMock(), "unix:///nonexistent")
    found.version = lambda: {"Version": version}  # type: ignore[method-assign]
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
    asked = mock.Mock(return_value={"Version": "5.4.2"})
    found.version = asked  # type: ignore[method-assign]
    assert found.release() == (5, 4) and found.release() == (5, 4) and found.forces_compression()
    assert asked.call_count == 1


@pytest.mark.parametrize("flag", ["rw", "readwrite", "rw=true"])
def test_a_writable_bind_mount_is_refused_where_buildahs_temp_folder_is_on_overlayfs(flag: str) -> None:
    """Found running podman 5.4.2 in a container whose /var/tmp was the container's overlayfs: the runtime's
    ``--mount=type=bind,source=runtime,...,rw`` failed ("setting up overlay ... invalid argument") and buildah
    1.39.3 then deleted every file of the project's runtime/ (the mount's source). Refused before podman runs."""
    dockerfile = RW_DOCKERFILE.replace(",rw ", f",{flag} ")
    refusal = buildah.overlay_refusal(dockerfile, {}, OVERLAY_ROOT)
    assert refusal is not None and "/var/tmp is on overlayfs" in refusal and "TMPDIR" in refusal
    on_a_volume = OVERLAY_ROOT + "40 22 254:0 /p5/vartmp /var/tmp rw,relatime - ext4 /dev/vda rw\n"
    assert buildah.overlay_refusal(dockerfile, {}, on_a_volume) is None
    assert buildah.overlay_refusal(dockerfile, {"TMPDIR": "/var/tmp/x"}, on_a_volume) is None
    assert buildah.overlay_refusal(dockerfile, {"TMPDIR": "/tmp"}, on_a_volume) is not None


def test_read_only_bind_mounts_and_other_targets_are_not_refused() -> None:
    read_only = "RUN --mount=type=bind,from=tools,source=/opt/uv,target=/tmp/uv --mount=type=bind,source=examples," \
                "target=/tmp/rw true"
    assert buildah.overlay_refusal(read_only, {}, OVERLAY_ROOT) is None
    assert buildah.filesystem(Path("/var/tmp"), "") == ""


def test_the_refusal_comes_before_podman_runs_and_leaves_the_project_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text(RW_DOCKERFILE)
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "pyproject.toml").write_text("[project]\n")
    request = BuildRequest(dockerfile="Dockerfile", context=".", platform="linux/amd64")
    with mock.patch.object(buildah, "_mountinfo", lambda: OVERLAY_ROOT), \
            mock.patch.object(buildah.subprocess, "Popen", side_effect=AssertionError("podman ran")), \
            mock.patch.dict("os.environ", {"TMPDIR": ""}), pytest.raises(TargetFailed, match="overlayfs"):
        buildah.run(request, per_run_network=True, cwd=tmp_path)
    assert (tmp_path / "runtime" / "pyproject.toml").exists()


def test_mount_points_with_escaped_spaces() -> None:
    info = OVERLAY_ROOT + r"41 22 254:0 /x /srv/my\040tmp rw - ext4 /dev/vda rw" + "\n"
    assert buildah.filesystem(Path("/srv/my tmp/buildah1"), info) == "ext4"
    assert buildah.filesystem(Path("/srv/my"), info) == "overlay"


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
    assert not found.client.mock_calls, "the engine was asked"
    with pytest.raises(engine.EngineError, match="podman names GPUs by CDI only"):
        engine.run_argv("podman", gpus)
    cdi = {**gpus, "device_requests": [docker.types.DeviceRequest(driver="cdi", device_ids=["nvidia.com/gpu=all"])]}
    assert engine.run_argv("podman", cdi)[-4:] == ["--device", "nvidia.com/gpu=all", "i", "true"]
    assert engine.run_argv("docker", gpus) == ["docker", "run", "--rm", "--gpus", "all", "i", "true"]
