"""``builder doctor``: the real engine on this machine, a dead engine, and GPU hosts laid out
as the kernel does (hostlayouts.py) because we lack the hardware.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from host.hostlayouts import H200, MI300X, make_dev, make_sysfs

from builder.cli.host import doctor_cmd
from builder.host import doctor
from builder.oci.docker import DockerAPI
from builder.oci.engine import EngineFacts


def by_item(checks: list[doctor.Check]) -> dict[str, doctor.Check]:
    return {c.item: c for c in checks}


@pytest.fixture
def dead_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    address = f"unix://{tmp_path / 'nothing-listens.sock'}"
    monkeypatch.setenv("DOCKER_HOST", address)
    monkeypatch.setenv("BUILDER_ENGINE", "docker")  # podman, where installed, would answer instead
    return address


@pytest.mark.engine
def test_engine_ok_on_this_machine(engine, project_dir: Path) -> None:
    result = CliRunner().invoke(doctor_cmd, ["--matrix", str(project_dir / "matrix.yaml"), "--json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    report = json.loads(result.stdout)
    daemon = next(c for c in report["checks"] if c["item"] == "docker daemon")
    info = engine.info()
    assert daemon["status"] == "ok"
    assert f"Docker {info.version} (API {info.api_version})" in daemon["found"]
    assert report["ok"] == (result.exit_code == 0)
    # No base.lock.json beside the copied matrix: it loads unpinned and says how to pin it.
    config = next(c for c in report["checks"] if c["item"] == "config")
    assert config["status"] == "warn" and "builder base" in config["fix"]


def test_dead_engine_fails_with_the_fix(dead_engine: str, project_dir: Path) -> None:
    result = CliRunner().invoke(doctor_cmd, ["--matrix", str(project_dir / "matrix.yaml")], color=False)
    assert result.exit_code == 1
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("[FAIL] docker daemon:"))
    assert f"no engine answers at {dead_engine}" in lines[at]
    assert lines[at + 1] == f"       fix: {doctor.DAEMON_FIX}"
    assert "[WARN] docker disk: not checked: no engine answered" in result.stdout


def test_broken_matrix_is_one_fail_item(dead_engine: str, project_dir: Path, tmp_path: Path) -> None:
    (project_dir / "matrix.yaml").write_text("registry: [\n")
    checks = doctor.run_checks(
        project_dir / "matrix.yaml", sysfs_root=tmp_path / "no-sys", dev_root=tmp_path / "no-dev"
    )
    items = by_item(checks)
    assert items["config"].status == "fail" and "matrix.yaml" in items["config"].found
    assert items["registry"].status == "warn"  # not checked, but the other checks still ran
    assert {"docker daemon", "gpus", "docker disk", "mmdebstrap", "docker-registry"} <= set(items)


def test_nvidia_host_without_driver_or_toolkit(dead_engine: str, project_dir: Path, tmp_path: Path) -> None:
    checks = doctor.run_checks(
        project_dir / "matrix.yaml",
        sysfs_root=make_sysfs(tmp_path / "sys", H200),
        dev_root=make_dev(tmp_path / "dev"),
        cdi_dirs=[tmp_path / "cdi"],
    )
    items = by_item(checks)
    assert items["gpus"].found.startswith("nvidia: 0000:19:00.0 (0x2335); builder run picks cpu")
    assert items["nvidia driver"].status == "fail" and "nvidia-smi must work" in (items["nvidia driver"].fix or "")
    assert items["nvidia runtime"].status == "warn"  # the engine is down: not checked
    assert doctor.exit_status(checks) == 1


def test_nvidia_cdi_spec_counts(dead_engine: str, project_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi/nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
    checks = doctor.run_checks(
        project_dir / "matrix.yaml",
        sysfs_root=make_sysfs(tmp_path / "sys", H200),
        dev_root=make_dev(tmp_path / "dev", "nvidia0", "nvidiactl"),
        cdi_dirs=[tmp_path / "cdi"],
    )
    items = by_item(checks)
    assert items["nvidia driver"].status == "ok"
    assert items["nvidia runtime"].status == "ok" and "nvidia.yaml" in items["nvidia runtime"].found


def test_nvidia_runtime_missing_from_engine(project_dir: Path, tmp_path: Path) -> None:
    ctx = doctor.Context(
        host=doctor.hardware.detect(
            make_sysfs(tmp_path / "sys", H200), make_dev(tmp_path / "dev", "nvidia0")
        ),
        info=EngineFacts("Docker", "26.1.5", runtimes=("runc",)),
    )
    runtime = by_item(doctor.check_nvidia(ctx))["nvidia runtime"]
    assert runtime.status == "fail" and "nvidia-ctk runtime configure --runtime=docker" in (runtime.fix or "")
    ctx.info = EngineFacts("Docker", "26.1.5", runtimes=("nvidia", "runc"))
    assert by_item(doctor.check_nvidia(ctx))["nvidia runtime"].status == "ok"


def test_amd_host_devices_and_groups(dead_engine: str, project_dir: Path, tmp_path: Path) -> None:
    dev = make_dev(tmp_path / "dev", "kfd", "dri/renderD128", gid=4242 if os.geteuid() == 0 else None)
    checks = doctor.run_checks(
        project_dir / "matrix.yaml", sysfs_root=make_sysfs(tmp_path / "sys", MI300X), dev_root=dev
    )
    items = by_item(checks)
    assert items["amd /dev/kfd"].status == "ok" and items["/dev/dri"].status == "ok"
    access = items[f"access {dev / 'kfd'}"]
    if os.geteuid() == 0:
        assert access.status == "ok" and "GID 4242" in access.found


def test_amd_host_without_kfd(dead_engine: str, project_dir: Path, tmp_path: Path) -> None:
    checks = doctor.run_checks(
        project_dir / "matrix.yaml",
        sysfs_root=make_sysfs(tmp_path / "sys", MI300X),
        dev_root=make_dev(tmp_path / "dev"),
    )
    items = by_item(checks)
    assert items["amd /dev/kfd"].status == "fail" and "amdgpu-install" in (items["amd /dev/kfd"].fix or "")
    assert items["/dev/dri"].status == "fail"


def test_missing_tools_and_low_disk(
    project_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.chdir(tmp_path)
    ctx = doctor.Context(host=doctor.hardware.HostGpus())
    doctor.check_config(ctx)  # cwd has no matrix: a FAIL, and both tools count as needed
    tools = by_item(doctor.check_tools(ctx))
    assert tools["mmdebstrap"].status == "fail" and tools["mmdebstrap"].fix == "apt-get install mmdebstrap"
    assert tools["docker-registry"].fix == "apt-get install docker-registry"
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda path: type("U", (), {"free": 5 * 2**30})())
    ctx.info = EngineFacts("Docker", "26.1.5", root="/var/lib/docker", disk_fix="docker system prune")
    disk = doctor.check_disk(ctx)[0]
    assert disk.status == "warn" and "5.0 GiB free" in disk.found and disk.fix == "docker system prune"
    assert disk.item == "docker disk"


def test_check_line_format() -> None:
    assert doctor.Check("ok", "x", "fine", "ignored").line() == "[OK]   x: fine"
    assert doctor.Check("fail", "tool", "missing", "apt-get install tool").line() == (
        "[FAIL] tool: missing\n       fix: apt-get install tool"
    )


def test_a_crashing_check_is_a_fail_item(dead_engine: str, project_dir: Path, monkeypatch) -> None:
    def boom(ctx):
        raise RuntimeError("bad")

    monkeypatch.setattr(doctor, "CHECKS", (boom, doctor.check_gpus))
    checks = doctor.run_checks(project_dir / "matrix.yaml", sysfs_root="/nonexistent")
    assert checks[0].status == "fail" and "RuntimeError('bad')" in checks[0].found
    assert checks[1].item == "gpus"


def test_compression_warns_only_where_this_host_could_not_pull_zstd(project_dir: Path) -> None:
    """zstd is the default: this engine (its ``info()``) and this host's enroot decide the warning.
    The old engine and the old enroot are stand-ins (their version strings): none runs here."""
    from builder.config.project import load_project
    from devtools.support import edit_matrix

    matrix = project_dir / "matrix.yaml"
    ctx = doctor.Context(doctor.hardware.HostGpus(), matrix, project=load_project(matrix, allow_unpinned=True))
    ctx.info = EngineFacts("Docker", "26.1.5+dfsg1", store="containerd")
    (ok,) = doctor.check_compression(ctx, enroot=lambda: None)
    assert ok.status == "ok" and "publish zstd layers (OCI media types): this engine pulls them" in ok.found
    ctx.info = EngineFacts("Docker", "20.10.24+dfsg1", store="containerd")
    (old,) = doctor.check_compression(ctx, enroot=lambda: None)
    assert old.status == "warn" and "Docker 20.10.24+dfsg1) cannot pull them" in old.found
    assert "compression: gzip" in (old.fix or "")
    ctx.info = EngineFacts("Docker", "26.1.5", store="containerd")
    _, enroot = doctor.check_compression(ctx, enroot=lambda: (3, 4))
    assert enroot.status == "warn" and "enroot 3.4" in enroot.found and "ENROOT_GZIP_PROGRAM=zstd" in (enroot.fix or "")
    assert [c.status for c in doctor.check_compression(ctx, enroot=lambda: (4, 1))] == ["ok"]
    edit_matrix(project_dir, compression="gzip")
    ctx.project = load_project(matrix, allow_unpinned=True)
    ctx.info = EngineFacts("Docker", "20.10.24")
    assert [c.status for c in doctor.check_compression(ctx, enroot=lambda: (3, 4))] == ["ok"]


@pytest.mark.parametrize(("version", "lacking"), [
    ("4.3.1", ["per-RUN --network", "--force-compression", "mounts cached stages", "registry cache"]),
    ("4.9.3", ["mounts cached stages", "registry cache"]),
    ("5.4.2", ["registry cache"]),
])
def test_podman_lacks_what_its_release_has_not_and_builds_follow_the_same_bounds(version, lacking):
    """doctor's list and the build's switches read the same bounds: what it says is missing is what builds avoid."""
    from builder.oci.engine import engine_version
    from builder.oci.podman import (
        PODMAN_FORCE_COMPRESSION,
        PODMAN_LAYER_CACHE,
        PODMAN_PER_RUN_NETWORK,
        podman_lacks,
    )

    lacks = podman_lacks(version).items
    assert len(lacks) == len(lacking) and all(word in line for word, line in zip(lacking, lacks, strict=True))
    found = engine_version(version)
    assert ("per-RUN --network" in lacks[0]) == (found < PODMAN_PER_RUN_NETWORK)
    assert any("--force-compression" in line for line in lacks) == (found < PODMAN_FORCE_COMPRESSION)
    assert any("cached stages" in line for line in lacks) == (found < PODMAN_LAYER_CACHE)


def test_rootless_network_says_when_the_tun_device_is_not_the_user_s(tmp_path):
    """A file stands in for /dev/net/tun (the check is os.access, as slirp4netns's open is the user's)."""
    from builder.host.doctor import _rootless_network

    tun = tmp_path / "tun"
    tun.touch(mode=0o666)
    assert _rootless_network(tun).status == "ok"
    missing = _rootless_network(tmp_path / "absent")
    assert missing.status == "warn" and "builder run cannot start" in missing.found
    assert "chmod 0666" in (missing.fix or "")


def test_compression_on_podman_says_it_pulls_zstd_and_warns_of_no_store(project_dir: Path) -> None:
    """podman's ServerVersion is its own release (5.4.2), never a Docker one, and it has no classic image store:
    podman 5.4.2's doctor warned that "this engine (Docker 5.4.2) cannot pull" zstd and that its "classic image
    store keeps gzip", while it pushed every layer zstd. Each podman builder takes pulls zstd."""
    from builder.config.project import load_project
    from builder.oci.podman import PodmanEngine

    matrix = project_dir / "matrix.yaml"
    ctx = doctor.Context(doctor.hardware.HostGpus(), matrix, project=load_project(matrix, allow_unpinned=True))
    for version in ("4.3.1", "5.4.2"):
        engine = PodmanEngine(_PodmanAPI(version), "unix:///nonexistent")
        ctx.engine, ctx.info = engine, engine.info()
        (ok,) = doctor.check_compression(ctx, enroot=lambda: None)
        assert ok.status == "ok" and "podman pulls them" in ok.found, ok
        assert ctx.engine.lacks().items[-1].startswith("BuildKit's registry cache")


@pytest.mark.parametrize(("version", "fix"), [
    ("4.3.1", "all but BuildKit's registry cache"), ("4.9.3", "all but BuildKit's registry cache"),
    ("5.4.2", "none in podman")])
def test_what_podman_lacks_names_the_fix_its_release_has(version: str, fix: str) -> None:
    """From 5 only BuildKit's registry cache is lacking, which no podman has: 5.4.2's doctor said "podman >= 4.7
    has the first two" of a list of one."""
    from builder.oci.podman import PodmanEngine

    assert fix in PodmanEngine(_PodmanAPI(version), "unix:///nonexistent").lacks().fix


class _PodmanAPI(DockerAPI):
    """What podman *version*'s compatible API answers to ``version`` and ``info`` (no podman runs here)."""

    def __init__(self, version: str) -> None:
        self.answer = version

    def version(self) -> dict[str, Any]:
        return {"Version": self.answer, "ApiVersion": "1.41"}

    def info(self) -> dict[str, Any]:
        return {"Driver": "overlay", "DriverStatus": [["Backing Filesystem", "extfs"]], "DockerRootDir": "/var/lib/c"}
