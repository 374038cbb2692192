"""CDI device names: ``builder run`` and ``builder doctor`` choose between ``--device
nvidia.com/gpu=all`` / ``--device amd.com/gpu=all`` and the classic flags, on hosts laid out as
real ones are (sysfs and /dev from hostlayouts.py, CDI specs as ``nvidia-ctk cdi generate`` and
AMD's container toolkit write them), with engines that do and don't support CDI; then, at the end,
on real engines (Docker with CDI on, podman) with a spec that injects ``/dev/null``: the plumbing,
not a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import pickle
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from click.testing import CliRunner
from helpers import run_builder
from host.hostlayouts import H200, MAX1550, MI300X, make_dev, make_sysfs

from builder.cli.host import run_cmd
from builder.config.project import Project
from builder.host import cdi, devices, doctor, hardware
from builder.host.launch import run_streamed
from builder.host.runspec import RunSpec, format_dry_run, run_spec
from builder.oci.docker import DockerAPI, DockerEngine
from builder.oci.engine import EngineFacts
from builder.oci.podman import PodmanEngine
from devtools.dockerd import DockerdUnavailable, extra_dockerd
from devtools.support import fail_or_skip

#: What ``nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`` writes (abridged: one GPU).
NVIDIA_SPEC = """\
---
cdiVersion: 0.5.0
containerEdits:
  deviceNodes:
  - path: /dev/nvidiactl
  - path: /dev/nvidia-uvm
  env:
  - NVIDIA_VISIBLE_DEVICES=void
devices:
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
  name: "0"
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
  name: all
kind: nvidia.com/gpu
"""
#: What AMD's container toolkit (``amd-ctk cdi generate``) writes, as JSON.
AMD_SPEC = {
    "cdiVersion": "0.6.0",
    "kind": "amd.com/gpu",
    "devices": [{"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/kfd"},
                                                                  {"path": "/dev/dri/renderD128"}]}}],
}
CDI_ENGINE = EngineFacts("Docker", "28.0.4", cdi_spec_dirs=("/etc/cdi", "/var/run/cdi"))
OLD_ENGINE = EngineFacts("Docker", "20.10.24")
CDI_OFF_ENGINE = EngineFacts("Docker", "26.1.4")


def cdi_tree(root: Path, nvidia: bool = False, amd: bool = False) -> tuple[str, str]:
    """``<root>/etc/cdi`` and ``<root>/var/run/cdi`` with the vendors' specs where the tools put them."""
    etc, run = root / "etc" / "cdi", root / "var" / "run" / "cdi"
    etc.mkdir(parents=True)
    run.mkdir(parents=True)
    if nvidia:
        (etc / "nvidia.yaml").write_text(NVIDIA_SPEC)
    if amd:
        (run / "amd.json").write_text(json.dumps(AMD_SPEC))
    (etc / "README").write_text("not a spec\n")  # other files in the folder are ignored
    return str(etc), str(run)


class _PodmanAPI(DockerAPI):
    """What podman's compatible API answers to ``version`` and ``info`` (4.3.1's, as ``podman system service``
    gives them: no ``CDISpecDirs``); no podman runs here."""

    def __init__(self, version: str) -> None:
        self.answer = version

    def version(self) -> dict[str, str]:
        return {"Version": self.answer, "ApiVersion": "1.41"}

    def info(self) -> dict[str, str]:
        return {"Driver": "overlay", "ServerVersion": self.answer, "BuildahVersion": "1.28.2"}


def _podman(release: float) -> PodmanEngine:
    """A :class:`PodmanEngine` of *release* (4.3: 4.3.1) on the stand-in API."""
    return PodmanEngine(_PodmanAPI(f"{release}.1"), "unix:///nonexistent")


def nvidia_host(tmp_path: Path) -> hardware.HostGpus:
    return hardware.detect(make_sysfs(tmp_path / "sys", H200), make_dev(tmp_path / "dev", "nvidia0", "nvidiactl"),
                           nvidia_runtime=True)


def amd_host(tmp_path: Path) -> hardware.HostGpus:
    return hardware.detect(make_sysfs(tmp_path / "sys", MI300X),
                           make_dev(tmp_path / "dev", "kfd", "dri/card0", "dri/renderD128"), nvidia_runtime=False)


def plan_argv(project: Project, target: str, host: hardware.HostGpus, dirs: tuple[str, str], info: EngineFacts | None,
              engine: str = "docker") -> list[str]:
    plan = run_spec(project, ["python", "-V"], target=target, host=host, environ={}, cwd="/tmp",
                    engine_info=lambda: info, cdi_dirs=dirs, engine=engine)
    assert not plan.problems, plan.problems
    return plan.argv()


def test_nvidia_spec_and_cdi_engine_use_the_cdi_name(project: Project, tmp_path: Path) -> None:
    argv = plan_argv(project, "nvidia-cu130", nvidia_host(tmp_path), cdi_tree(tmp_path, nvidia=True), CDI_ENGINE)
    line = shlex.join(argv)
    assert "--device nvidia.com/gpu=all" in line and "--gpus" not in line


def test_amd_spec_replaces_the_dev_nodes_but_keeps_groups_and_ipc(project: Project, tmp_path: Path) -> None:
    plan = run_spec(project, ["true"], target="amd-rocm5.7", host=amd_host(tmp_path), environ={}, cwd="/tmp",
                      engine_info=lambda: CDI_ENGINE, cdi_dirs=cdi_tree(tmp_path, amd=True))
    assert plan.cdi_devices == ("amd.com/gpu=all",) and plan.devices == ()
    assert plan.ipc_mode == "host"
    requests = plan.create_kwargs()["device_requests"]
    assert [(r["Driver"], r["DeviceIDs"]) for r in requests] == [("cdi", ["amd.com/gpu=all"])]
    assert any("devices by CDI name: CDI spec" in n for n in plan.notes)


@pytest.mark.parametrize(("info", "why"), [
    (OLD_ENGINE, "Docker 20.10.24 predates CDI (25.0)"),
    (CDI_OFF_ENGINE, 'Docker 26.1.4 has CDI off (set "features": {"cdi": true} in daemon.json)'),
    (None, "no engine answered"),
])
def test_engine_without_cdi_keeps_the_classic_flags(project: Project, tmp_path: Path, info, why: str) -> None:
    dirs = cdi_tree(tmp_path, nvidia=True)
    argv = plan_argv(project, "nvidia-cu130", nvidia_host(tmp_path), dirs, info)
    assert "--gpus" in argv and "nvidia.com/gpu=all" not in argv
    choice = devices.host_cdi("nvidia", lambda: info, dirs)
    assert not choice.use and choice.why == f"CDI spec {dirs[0]}/nvidia.yaml for nvidia.com/gpu, but {why}; " \
                                            "the classic flags"


def test_no_spec_never_asks_the_engine(project: Project, tmp_path: Path) -> None:
    def boom():
        raise AssertionError("the engine must not be asked without a CDI spec")
    dirs = cdi_tree(tmp_path, amd=True)  # an AMD spec does not make NVIDIA GPUs CDI devices
    plan = run_spec(project, ["true"], target="nvidia-cu130", host=nvidia_host(tmp_path), environ={}, cwd="/tmp",
                      engine_info=boom, cdi_dirs=dirs)
    assert plan.gpus and not plan.cdi_devices
    assert devices.host_cdi("nvidia", boom, dirs).why == (
        "no CDI spec for nvidia.com/gpu in /etc/cdi or /var/run/cdi; the classic flags")


def test_cpu_target_and_no_gpus_never_use_cdi(project: Project, tmp_path: Path) -> None:
    dirs, host = cdi_tree(tmp_path, nvidia=True), nvidia_host(tmp_path)
    cpu = run_spec(project, ["true"], target="cpu", host=host, environ={}, cwd="/tmp",
                     engine_info=lambda: CDI_ENGINE, cdi_dirs=dirs)
    off = run_spec(project, ["true"], target="nvidia-cu130", gpus=False, host=host, environ={},
                     cwd="/tmp", engine_info=lambda: CDI_ENGINE, cdi_dirs=dirs)
    assert not cpu.cdi_devices and not off.cdi_devices and not off.gpus


@pytest.mark.parametrize(("info", "found"), [
    (CDI_ENGINE, ("builder run uses --device nvidia.com/gpu=all: CDI spec {etc}/nvidia.yaml for nvidia.com/gpu "
                 "and Docker 28.0.4 reads CDI specs from /etc/cdi, /var/run/cdi")),
    (OLD_ENGINE, ("builder run uses --gpus all: CDI spec {etc}/nvidia.yaml for nvidia.com/gpu, but Docker 20.10.24 "
                 "predates CDI (25.0); the classic flags")),
])
def test_doctor_says_which_and_why(tmp_path: Path, info, found: str) -> None:
    etc, run = cdi_tree(tmp_path, nvidia=True)
    ctx = doctor.Context(nvidia_host(tmp_path), info=info, cdi_dirs=(etc, run))
    assert [c.line() for c in doctor.check_cdi(ctx)] == [f"[OK]   nvidia devices: {found.format(etc=etc)}"]


def test_doctor_amd_without_spec_and_no_gpu_host(tmp_path: Path) -> None:
    dirs = cdi_tree(tmp_path)
    amd = doctor.check_cdi(doctor.Context(amd_host(tmp_path), info=CDI_ENGINE, cdi_dirs=dirs))
    assert [c.found for c in amd] == [
        ("builder run uses --device /dev/kfd --device /dev/dri: no CDI spec for amd.com/gpu in /etc/cdi or "
        "/var/run/cdi; the classic flags")]
    assert doctor.check_cdi(doctor.Context(hardware.HostGpus(), info=CDI_ENGINE, cdi_dirs=dirs)) == []


#: A spec that declares each card and no ``all`` device.
CARDS_SPEC = {"cdiVersion": "0.6.0", "kind": "intel.com/gpu", "devices": [
    {"name": "card0", "containerEdits": {"deviceNodes": [{"path": "/dev/dri/card0"}, {"path": "/dev/dri/renderD128"}]}},
    {"name": "card1", "containerEdits": {"deviceNodes": [{"path": "/dev/dri/card1"}, {"path": "/dev/dri/renderD129"}]}},
]}


def intel_host(tmp_path: Path) -> hardware.HostGpus:
    return hardware.detect(make_sysfs(tmp_path / "sys", MAX1550), make_dev(tmp_path / "dev", "dri/card0",
                                                                            "dri/renderD128"))


def test_a_spec_without_all_names_each_device(project: Project, tmp_path: Path) -> None:
    """Where no spec declares ``all``, ``kind=all`` would be refused (unresolvable CDI device): each
    declared device is asked for instead, here Intel's, whose CDI kind is ``intel.com/gpu``."""
    etc, run = cdi_tree(tmp_path)
    (Path(run) / "intel.json").write_text(json.dumps(CARDS_SPEC))
    host = intel_host(tmp_path)
    plan = run_spec(project, ["true"], target="intel-oneapi", host=host, environ={}, cwd="/tmp",
                    engine_info=lambda: CDI_ENGINE, cdi_dirs=(etc, run))
    assert plan.cdi_devices == ("intel.com/gpu=card0", "intel.com/gpu=card1") and plan.devices == ()
    assert "--device intel.com/gpu=card0 --device intel.com/gpu=card1" in shlex.join(plan.argv())
    ctx = doctor.Context(host, info=CDI_ENGINE, cdi_dirs=(etc, run))
    assert doctor.check_cdi(ctx)[0].found.startswith(
        "builder run uses --device intel.com/gpu=card0 --device intel.com/gpu=card1: CDI spec")


@pytest.mark.parametrize("text", [
    "cdiVersion: 0.5.0\nkind: nvidia.com\ndevices: [{name: '0'}]\n",  # a kind without its class
    "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: [{name: 'gpu 0'}]\n",  # a space in a device name
    "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: [{name: '-0'}]\n",
    "kind: nvidia.com/gpu\ndevices: [{name: '0'}]\n",  # no cdiVersion
    "- a list\n",
    "kind: [unclosed\n",
])
def test_a_spec_against_the_rules_is_skipped_as_the_engines_skip_it(tmp_path: Path, text: str) -> None:
    (tmp_path / "bad.yaml").write_text(text)
    (tmp_path / "good.yaml").write_text(NVIDIA_SPEC)
    assert [s.path for s in cdi.specs([tmp_path])] == [str(tmp_path / "good.yaml")]
    assert cdi.read(tmp_path / "bad.yaml") is None


def test_a_spec_that_declares_no_device_keeps_the_classic_flags(tmp_path: Path) -> None:
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
    choice = devices.host_cdi("nvidia", lambda: CDI_ENGINE, [tmp_path])
    assert not choice.use and choice.why == f"CDI spec {tmp_path}/nvidia.yaml for nvidia.com/gpu declares no " \
                                            "device; the classic flags"


def test_podman_reads_cdi_specs_without_a_setting(project: Project, tmp_path: Path) -> None:
    """Podman's Docker-compatible ``info`` (as ``podman system service`` 4.3.1 answers it) lists no
    ``CDISpecDirs``: podman reads ``/etc/cdi`` and ``/var/run/cdi`` always (its facts say so), so a plan for podman
    never asks it."""
    podman = _podman(4.3).info()
    assert devices.engine_cdi(podman) == (True, "podman 4.3.1 reads CDI specs from /etc/cdi, /var/run/cdi")

    def boom():
        raise AssertionError("podman must not be asked whether it reads CDI specs")
    argv = plan_argv(project, "nvidia-cu130", nvidia_host(tmp_path), cdi_tree(tmp_path, nvidia=True), None,
                     engine="podman")
    assert argv[:3] == ["podman", "run", "--rm"] and "--device nvidia.com/gpu=all" in shlex.join(argv)
    assert devices.host_cdi("nvidia", boom, cdi_tree(tmp_path / "again", nvidia=True), "podman").use


# --- each engine's own line: builder run --dry-run --engine podman|docker on a laid-out NVIDIA host ------------

#: What builder run says on podman when the host has no CDI spec for NVIDIA's GPUs.
NO_SPEC = ("podman gives nvidia GPUs by CDI name only, and no CDI spec for nvidia.com/gpu in /etc/cdi or "
           "/var/run/cdi: make the spec with 'nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml' (as root), "
           "or pass --no-gpus")


def dry_run(project_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str, dirs: tuple[str, str],
            *args: str) -> list[str]:
    """``builder run --dry-run --engine ENGINE -t nvidia-cu130 ARGS -- python -V`` (click, in this process) on an
    H200 host laid out under *tmp_path*, reading CDI specs from *dirs*; its output lines."""
    sysfs, dev = make_sysfs(tmp_path / "sys", H200), make_dev(tmp_path / "dev", "nvidia0", "nvidiactl")
    monkeypatch.setenv("BUILDER_ENGINE", engine)  # --engine sets it for the process: undone after the test
    monkeypatch.chdir(tmp_path)
    argv = ["--matrix", str(project_dir / "matrix.yaml"), "--allow-unpinned", "--engine", engine, "--sysfs-root",
            str(sysfs), "--dev-root", str(dev), "--dry-run", "-t", "nvidia-cu130", *args, "--", "python", "-V"]
    result = CliRunner().invoke(run_cmd, argv, env={"BUILDER_CDI_DIRS": " ".join(dirs)})
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def test_dry_run_on_podman_names_nvidia_gpus_by_cdi(project_dir: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The H200 run: ``--dry-run --engine podman`` printed ``docker run ... --gpus all``. Now podman's own line,
    NVIDIA's GPUs by their CDI name, and no engine asked (podman reads the specs always)."""
    lines = dry_run(project_dir, tmp_path, monkeypatch, "podman", cdi_tree(tmp_path, nvidia=True))
    assert not [line for line in lines if line.startswith("# problem")], lines
    argv = shlex.split(lines[-1])
    assert argv[:3] == ["podman", "run", "--rm"] and "--gpus" not in argv
    assert ["--device", "nvidia.com/gpu=all"] in [argv[i:i + 2] for i in range(len(argv))]
    assert argv[-3:] == ["localhost:5999" + argv[-3].split("localhost:5999", 1)[1], "python", "-V"]


def test_dry_run_on_podman_without_a_spec_says_how_to_make_one(project_dir: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """No CDI spec for NVIDIA: one line says why podman gives no GPU and the command that makes the spec; the line
    below carries no ``--gpus`` (a no-op before podman 5). ``builder run`` itself refuses with that line (exit 2),
    before any engine is asked."""
    etc, run = cdi_tree(tmp_path, amd=True)  # an AMD spec does not name NVIDIA GPUs
    lines = dry_run(project_dir, tmp_path, monkeypatch, "podman", (etc, run))
    assert [line for line in lines if line.startswith("# problem")] == [
        "# problem: " + NO_SPEC]
    assert lines[-1].startswith("podman run --rm ") and "--gpus" not in lines[-1] and "--device" not in lines[-1]
    proc = run_builder("run", "--matrix", str(project_dir / "matrix.yaml"), "--allow-unpinned", "--engine", "podman",
                       "--sysfs-root", str(tmp_path / "sys"), "--dev-root", str(tmp_path / "dev"), "-t",
                       "nvidia-cu130", "--", "true", cwd=tmp_path, env={"BUILDER_CDI_DIRS": f"{etc} {run}"})
    assert proc.returncode == 2 and proc.stderr == f"error: {NO_SPEC}\n", proc.stderr


def test_dry_run_on_docker_keeps_its_line(project_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Docker without a CDI spec: ``--gpus all`` (the NVIDIA runtime), the line as it was, word for word."""
    lines = dry_run(project_dir, tmp_path, monkeypatch, "docker", cdi_tree(tmp_path))
    ref = lines[0].split("(")[1].rstrip(")")
    assert lines[-1] == shlex.join([
        "docker", "run", "--rm", "--label", "io.ml-image-builder.run=1", "--label",
        "io.ml-image-builder.run.target=nvidia-cu130", "--label", f"io.ml-image-builder.run.image={ref}",
        "--gpus", "all", "--shm-size", "8g", "--mount", f"type=bind,source={tmp_path.resolve()},target=/workspace",
        "--workdir", "/workspace", "--env", "WORLD_SIZE=1", "--env", "RANK=0", "--env", "LOCAL_RANK=0", "--env",
        "MASTER_ADDR=127.0.0.1", "--env", f"MASTER_PORT={os.environ.get('MASTER_PORT', '29500')}", ref, "python",
        "-V"])


def test_amd_on_podman_keeps_its_nodes_or_takes_its_cdi_name(project: Project, tmp_path: Path) -> None:
    """AMD's GPUs are device nodes podman can pass as they are: without a spec, the nodes (no line about CDI);
    with amd-ctk's spec, the CDI name; the groups and IPC stay either way."""
    host = amd_host(tmp_path)
    nodes = run_spec(project, ["true"], target="amd-rocm5.7", host=host, environ={}, cwd="/tmp",
                     cdi_dirs=cdi_tree(tmp_path / "none"), engine="podman")
    assert nodes.problems == () and nodes.devices == ("/dev/kfd", "/dev/dri") and not nodes.cdi_devices
    line = shlex.join(nodes.argv())
    assert line.startswith("podman run --rm ") and "--device /dev/kfd --device /dev/dri" in line
    named = run_spec(project, ["true"], target="amd-rocm5.7", host=host, environ={}, cwd="/tmp",
                     cdi_dirs=cdi_tree(tmp_path / "amd", amd=True), engine="podman")
    assert named.cdi_devices == ("amd.com/gpu=all",) and named.devices == () and named.ipc_mode == "host"
    assert "--device amd.com/gpu=all" in shlex.join(named.argv())


def test_podman_turns_labelling_off_where_selinux_enforces(project: Project, tmp_path: Path) -> None:
    """A host whose selinuxfs says it enforces (``/sys/fs/selinux/enforce`` is ``1``): podman labels the
    container, so its GPUs come with ``--security-opt label=disable`` (NVIDIA's podman recipe) and a note; Docker
    (whose daemon labels only with --selinux-enabled) and a permissive host get none."""
    sysfs = make_sysfs(tmp_path / "sys", H200)
    (sysfs / "fs" / "selinux").mkdir(parents=True)
    enforce = sysfs / "fs" / "selinux" / "enforce"
    dev = make_dev(tmp_path / "dev", "nvidia0", "nvidiactl")
    dirs = cdi_tree(tmp_path, nvidia=True)

    def plan(engine: str):
        host = hardware.detect(sysfs, dev, nvidia_runtime=True)
        return run_spec(project, ["true"], target="nvidia-cu130", host=host, environ={}, cwd="/tmp", cdi_dirs=dirs,
                        engine_info=lambda: CDI_ENGINE, engine=engine)

    enforce.write_text("1")
    labelled = plan("podman")
    assert "--security-opt label=disable --shm-size" in shlex.join(labelled.argv())
    assert any(n.startswith("SELinux enforces here: --security-opt label=disable") for n in labelled.notes)
    assert "--security-opt" not in plan("docker").argv()
    enforce.write_text("0")
    assert "--security-opt" not in plan("podman").argv()


def test_doctor_on_podman_without_a_spec_fails_with_the_fix(tmp_path: Path) -> None:
    """``builder doctor`` on podman: no "builder run uses --gpus all" (podman has none); one FAIL with the fix."""
    dirs = cdi_tree(tmp_path)
    engine = _podman(4.3)
    ctx = doctor.Context(nvidia_host(tmp_path), engine=engine, info=engine.info(), cdi_dirs=dirs)
    checks = [c for c in doctor.check_nvidia(ctx) + doctor.check_cdi(ctx) if c.item != "nvidia driver"]
    assert [c.line() for c in checks] == [(
        "[FAIL] nvidia runtime: podman gives nvidia GPUs by CDI name only, and no CDI spec for nvidia.com/gpu in "
        "/etc/cdi or /var/run/cdi\n       fix: apt-get install nvidia-container-toolkit && nvidia-ctk cdi generate "
        "--output=/var/run/cdi/nvidia.yaml")]
    (Path(dirs[0]) / "nvidia.yaml").write_text(NVIDIA_SPEC)
    lines = [c.line() for c in doctor.check_nvidia(ctx) + doctor.check_cdi(ctx)]
    assert lines[1:] == [f"[OK]   nvidia runtime: CDI spec for nvidia.com/gpu: {dirs[0]}/nvidia.yaml",
                         ("[OK]   nvidia devices: builder run uses --device nvidia.com/gpu=all: CDI spec "
                          f"{dirs[0]}/nvidia.yaml for nvidia.com/gpu and podman 4.3.1 reads CDI specs from /etc/cdi, "
                          "/var/run/cdi")]


def test_doctor_run_checks_reports_cdi_for_a_laid_out_host(tmp_path: Path, project_dir: Path) -> None:
    etc, run = cdi_tree(tmp_path, nvidia=True)
    sysfs, dev = make_sysfs(tmp_path / "sys", H200), make_dev(tmp_path / "dev", "nvidia0", "nvidiactl")
    checks = {c.item: c for c in doctor.run_checks(project_dir / "matrix.yaml", sysfs_root=sysfs, dev_root=dev,
                                                   cdi_dirs=(etc, run))}
    assert checks["nvidia runtime"].status == "ok" and f"{etc}/nvidia.yaml" in checks["nvidia runtime"].found
    assert checks["nvidia devices"].found.startswith("builder run uses ")


# --- the real engines -----------------------------------------------------------------------
# A CDI spec that injects a harmless node that exists everywhere: the host's /dev/null as
# /dev/accel-test0, under a test vendor's kind. What these tests prove is the plumbing (the spec
# read, builder run's choice of the CDI name, the engine's injection of the spec's edits), not a GPU.

TEST_KIND = "example.com/gpu"
TEST_SPEC = f"""\
cdiVersion: 0.5.0
kind: {TEST_KIND}
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/accel-test0
      hostPath: /dev/null
"""
#: Where the podman test's namespace mounts the spec folder: ``/var/run/cdi`` (``/var/run`` is ``/run``).
MOUNT_POINT = Path("/var/run/cdi").resolve()
#: What ``ls -l /dev/accel-test0`` shows of the injected node: a character device 1, 3 (/dev/null's).
NODE = re.compile(r"^c\S+\s+\d+\s+\S+\s+\S+\s+1,\s+3\s.*/dev/accel-test0$", re.MULTILINE)


@pytest.fixture
def test_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test spec in a folder of its own, and the test kind as NVIDIA's: the host stand-in
    (:func:`nvidia_host`) has an NVIDIA GPU, so ``builder run`` picks the NVIDIA target and asks
    for the vendor's kind, here the test's (no NVIDIA spec, driver or GPU is on this machine)."""
    folder = tmp_path / "cdi"
    folder.mkdir()
    (folder / "example.yaml").write_text(TEST_SPEC)
    monkeypatch.setitem(devices.CDI_KINDS, "nvidia", TEST_KIND)
    return folder


def cdi_plan(project: Project, tmp_path: Path, spec: Path, info: EngineFacts) -> RunSpec:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    plan = run_spec(project, ["ls", "-l", "/dev/accel-test0"], target="nvidia-cu130", host=nvidia_host(tmp_path),
                    environ={}, cwd=workspace, engine_info=lambda: info, cdi_dirs=[spec])
    assert plan.cdi_devices == (f"{TEST_KIND}=0",) and not plan.gpus and not plan.problems, plan
    return plan


@pytest.mark.engine
@pytest.mark.slow
def test_docker_injects_the_device_builder_run_names(project: Project, tmp_path: Path, test_spec: Path) -> None:
    """Docker 26.1 with CDI on (``"features": {"cdi": true}``, as ``make host`` writes it) and the
    test's spec folder (``cdi-spec-dirs``): a private engine (devtools/dockerd.py). Its ``docker
    info`` makes ``builder run`` choose the CDI name, whose device request (driver ``cdi``) the
    engine turns into the node; without the name, the same image has no such node."""
    try:
        with extra_dockerd(tmp_path / "engine", "cd", cdi_spec_dirs=[test_spec]) as host:
            engine = DockerEngine(DockerAPI(docker.DockerClient(base_url=host, timeout=300)))
            try:
                assert engine.info().cdi_spec_dirs == (str(test_spec),)
                plan = cdi_plan(project, tmp_path, test_spec, engine.info())
                build_busybox(engine.client, tmp_path, plan.image)
                out, err = io.BytesIO(), io.BytesIO()
                assert run_streamed(engine, plan, stdout=out, stderr=err) == 0, err.getvalue()
                assert NODE.search(out.getvalue().decode()), out.getvalue()
                without = dataclasses.replace(plan, cdi_devices=())
                assert run_streamed(engine, without, stdout=io.BytesIO(), stderr=err) != 0
                assert b"/dev/accel-test0: No such file or directory" in err.getvalue()
            finally:
                engine.close()
    except DockerdUnavailable as exc:
        fail_or_skip(str(exc))


def busybox_binary() -> Path:
    found = next((Path(p) for p in ("/bin/busybox", "/usr/bin/busybox") if Path(p).is_file()), None)
    if found is None:
        fail_or_skip("no static busybox (apt-get install busybox-static)")
    return found


def build_busybox(client: docker.DockerClient, tmp_path: Path, ref: str) -> None:
    """*ref* on a 2 MB image (FROM scratch + static busybox, which runs the command), built offline."""
    context = tmp_path / "image"
    context.mkdir()
    shutil.copy(busybox_binary(), context / "busybox")
    (context / "Dockerfile").write_text('FROM scratch\nCOPY busybox /bin/busybox\nENTRYPOINT ["/bin/busybox"]\n')
    client.images.build(path=str(context), tag=ref, rm=True, forcerm=True)


#: What a podman test runs in its namespace: ``builder run``'s plan (pickled) through PodmanEngine.
RUN_WITH_PODMAN = """
import pickle, sys
from builder.host.launch import run_streamed
from builder.oci.podman import connect_podman
with open(sys.argv[1], "rb") as handle:
    plan = pickle.load(handle)
engine = connect_podman()
try:
    sys.exit(run_streamed(engine, plan))
finally:
    engine.close()
"""


@dataclasses.dataclass
class PodmanSandbox:
    """A rootful podman 4.3 (Debian 12's) of the test's own: storage and run state in *state*
    (``CONTAINERS_STORAGE_CONF``), and a mount namespace per command where the test's spec folder is
    ``/var/run/cdi`` (podman reads CDI specs from ``/etc/cdi`` and ``/var/run/cdi`` only; ``--cdi-spec-dir``
    came later), which no other process on the machine sees."""

    podman: list[str]
    unshare: str
    spec: Path
    state: Path
    env: dict[str, str]

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """*argv* in a mount namespace of its own, with the spec folder on /var/run/cdi."""
        script = f'mount --bind "$0" {MOUNT_POINT} && exec "$@"'
        return subprocess.run([self.unshare, "--mount", "--propagation", "private", "sh", "-c", script,
                               str(self.spec), *argv], capture_output=True, text=True, check=False, timeout=300,
                              env=self.env)

    def import_busybox(self, tmp_path: Path, ref: str) -> None:
        """*ref* on FROM scratch + static busybox (its entrypoint runs the command), imported offline."""
        tar = tmp_path / "busybox.tar"
        with tarfile.open(tar, "w") as archive:
            archive.add(busybox_binary(), arcname="bin/busybox")
        imported = self.run(*self.podman, "import", "--change", 'ENTRYPOINT ["/bin/busybox"]', str(tar), ref)
        assert imported.returncode == 0, imported.stderr

    def left(self) -> list[str]:
        """The containers podman still holds."""
        return subprocess.run([*self.podman, "ps", "-aq"], capture_output=True, text=True, check=False,
                              env=self.env).stdout.split()


@pytest.fixture
def podman_sandbox(test_spec: Path) -> Iterator[PodmanSandbox]:
    """:class:`PodmanSandbox` for the test's spec; its images, storage and the mount point it made go after."""
    binary = shutil.which("podman")
    unshare = shutil.which("unshare")
    if binary is None or unshare is None or os.geteuid() != 0:
        fail_or_skip("needs root, podman (apt-get install podman) and unshare")
    state = Path(tempfile.mkdtemp(prefix="mlb-cdi-podman-", dir="/var/tmp"))
    (state / "storage.conf").write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{state / "root"}"\n'
                                        f'runroot = "{state / "run"}"\n')
    env = {**os.environ, "CONTAINERS_STORAGE_CONF": str(state / "storage.conf"), "TMPDIR": str(state)}
    env.pop("CONTAINER_HOST", None)
    sandbox = PodmanSandbox([binary], unshare, test_spec, state, env)
    made = not MOUNT_POINT.exists()
    try:
        MOUNT_POINT.mkdir(exist_ok=True)  # empty outside the test's namespace
        yield sandbox
    finally:
        subprocess.run([binary, "rmi", "--all", "--force"], capture_output=True, check=False, timeout=120, env=env)
        shutil.rmtree(state, ignore_errors=True)
        if made:
            with contextlib.suppress(OSError):
                MOUNT_POINT.rmdir()


@pytest.mark.engine
@pytest.mark.slow
def test_podman_injects_the_device_builder_run_names(project: Project, tmp_path: Path,
                                                     podman_sandbox: PodmanSandbox) -> None:
    """Podman 4.3 (Debian 12's) through ``PodmanEngine``, as ``builder run --engine podman`` drives it, in
    :class:`PodmanSandbox`: the plan runs there in a child Python (``run_streamed`` on ``connect_podman()``).
    ``builder run``'s choice comes from what podman's Docker-compatible API answers to ``info``. That API
    drops a device request of driver ``cdi`` without a word (the container starts without the node), so
    PodmanEngine creates such a container with the CLI; this test fails if it goes back to the API."""
    sandbox = podman_sandbox
    info = podman_info(sandbox.podman, sandbox.state, sandbox.env)
    plan = cdi_plan(project, tmp_path, sandbox.spec, info)
    sandbox.import_busybox(tmp_path, plan.image)

    def run(spec: RunSpec) -> subprocess.CompletedProcess[str]:
        pickled = tmp_path / "plan.pickle"
        pickled.write_bytes(pickle.dumps(spec))
        return sandbox.run(sys.executable, "-c", RUN_WITH_PODMAN, str(pickled))

    ran = run(plan)
    assert ran.returncode == 0 and NODE.search(ran.stdout), ran.stdout + ran.stderr
    without = run(dataclasses.replace(plan, cdi_devices=()))
    assert without.returncode != 0 and "/dev/accel-test0: No such file or directory" in without.stderr
    assert not sandbox.left(), f"containers left behind: {sandbox.left()}"


@pytest.mark.engine
@pytest.mark.slow
def test_podman_runs_the_dry_run_line_as_printed(project: Project, tmp_path: Path,
                                                 podman_sandbox: PodmanSandbox) -> None:
    """What ``builder run --dry-run`` prints on podman, run by sh as a user would paste it (in
    :class:`PodmanSandbox`): a ``podman run`` that names the device by its CDI name, and the engine injects the
    spec's node; the container is gone after (``--rm``). Planned for podman, nothing asks the engine."""
    sandbox = podman_sandbox
    workspace = tmp_path / "ws"
    workspace.mkdir()
    plan = run_spec(project, ["ls", "-l", "/dev/accel-test0"], target="nvidia-cu130", host=nvidia_host(tmp_path),
                    environ={}, cwd=workspace, cdi_dirs=[sandbox.spec], engine="podman")
    assert plan.cdi_devices == (f"{TEST_KIND}=0",) and not plan.problems, plan
    text = format_dry_run(plan)
    line = text.splitlines()[-1]
    assert line.startswith("podman run --rm ") and f"--device {TEST_KIND}=0" in line, text
    sandbox.import_busybox(tmp_path, plan.image)
    ran = sandbox.run("sh", "-c", text)
    assert ran.returncode == 0 and NODE.search(ran.stdout), text + "\n" + ran.stdout + ran.stderr
    assert not sandbox.left(), f"containers left behind: {sandbox.left()}"


def podman_info(podman: list[str], state: Path, env: dict[str, str]) -> EngineFacts:
    """:class:`PodmanEngine`'s facts from podman's Docker-compatible API (``podman system service``)."""
    sock = state / "api.sock"
    service = subprocess.Popen([*podman, "system", "service", "--time", "0", f"unix://{sock}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert service.poll() is None and time.monotonic() < deadline, "podman system service did not start"
            time.sleep(0.2)
        engine = PodmanEngine(DockerAPI(docker.DockerClient(base_url=f"unix://{sock}", timeout=60)), f"unix://{sock}")
        with contextlib.closing(engine):
            return engine.info()
    finally:
        service.terminate()
        service.wait(timeout=30)
