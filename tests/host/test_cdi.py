"""CDI device names: ``builder run`` and ``builder doctor`` choose between ``--device
nvidia.com/gpu=all`` / ``--device amd.com/gpu=all`` and the classic flags, on hosts laid out as
real ones are (sysfs and /dev from hostlayouts.py, CDI specs as ``nvidia-ctk cdi generate`` and
AMD's container toolkit write them), with engines that do and don't support CDI.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from host.hostlayouts import H200, MAX1550, MI300X, make_dev, make_sysfs

from builder.config.project import Project
from builder.host import cdi, devices, doctor, hardware
from builder.host.runspec import run_spec

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
CDI_ENGINE = {"ServerVersion": "28.0.4", "CDISpecDirs": ["/etc/cdi", "/var/run/cdi"]}
OLD_ENGINE = {"ServerVersion": "20.10.24"}
CDI_OFF_ENGINE = {"ServerVersion": "26.1.4"}


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


def nvidia_host(tmp_path: Path) -> hardware.HostGpus:
    return hardware.detect(make_sysfs(tmp_path / "sys", H200), make_dev(tmp_path / "dev", "nvidia0", "nvidiactl"),
                           nvidia_runtime=True)


def amd_host(tmp_path: Path) -> hardware.HostGpus:
    return hardware.detect(make_sysfs(tmp_path / "sys", MI300X),
                           make_dev(tmp_path / "dev", "kfd", "dri/card0", "dri/renderD128"), nvidia_runtime=False)


def plan_argv(project: Project, target: str, host: hardware.HostGpus, dirs: tuple[str, str], info) -> list[str]:
    plan = run_spec(project, ["python", "-V"], target=target, host=host, environ={}, cwd="/tmp",
                      engine_info=lambda: info, cdi_dirs=dirs)
    assert not plan.problems, plan.problems
    return plan.docker_argv()


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
    assert "--device intel.com/gpu=card0 --device intel.com/gpu=card1" in shlex.join(plan.docker_argv())
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
    ``CDISpecDirs``: podman reads ``/etc/cdi`` and ``/var/run/cdi`` always."""
    podman = {"ServerVersion": "4.3.1", "BuildahVersion": "1.28.2", "Rootless": False}
    assert devices.engine_cdi(podman) == (True, "podman 4.3.1 reads CDI specs from /etc/cdi, /var/run/cdi")
    argv = plan_argv(project, "nvidia-cu130", nvidia_host(tmp_path), cdi_tree(tmp_path, nvidia=True), podman)
    assert "--device nvidia.com/gpu=all" in shlex.join(argv)


def test_doctor_run_checks_reports_cdi_for_a_laid_out_host(tmp_path: Path, project_dir: Path) -> None:
    etc, run = cdi_tree(tmp_path, nvidia=True)
    sysfs, dev = make_sysfs(tmp_path / "sys", H200), make_dev(tmp_path / "dev", "nvidia0", "nvidiactl")
    checks = {c.item: c for c in doctor.run_checks(project_dir / "matrix.yaml", sysfs_root=sysfs, dev_root=dev,
                                                   cdi_dirs=(etc, run))}
    assert checks["nvidia runtime"].status == "ok" and f"{etc}/nvidia.yaml" in checks["nvidia runtime"].found
    assert checks["nvidia devices"].found.startswith("builder run uses ")
