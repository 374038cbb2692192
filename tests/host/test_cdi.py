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
from pathlib import Path

import docker
import pytest
from host.hostlayouts import H200, MAX1550, MI300X, make_dev, make_sysfs

from builder.config.project import Project
from builder.host import cdi, devices, doctor, hardware
from builder.host.launch import run_streamed
from builder.host.runspec import RunSpec, run_spec
from builder.oci.engine import DockerEngine
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


def cdi_plan(project: Project, tmp_path: Path, spec: Path, info: dict) -> RunSpec:
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
            engine = DockerEngine(docker.DockerClient(base_url=host, timeout=300))
            try:
                assert engine.info()["CDISpecDirs"] == [str(test_spec)]
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


#: What the podman test runs in its namespace: ``builder run``'s plan (pickled) through PodmanEngine.
RUN_WITH_PODMAN = """
import pickle, sys
from builder.host.launch import run_streamed
from builder.oci.engine import connect_podman
with open(sys.argv[1], "rb") as handle:
    plan = pickle.load(handle)
engine = connect_podman()
try:
    sys.exit(run_streamed(engine, plan))
finally:
    engine.close()
"""


@pytest.mark.engine
@pytest.mark.slow
def test_podman_injects_the_device_builder_run_names(project: Project, tmp_path: Path, test_spec: Path) -> None:
    """Podman 4.3 (Debian 12's) through ``PodmanEngine``, as ``builder run --engine podman`` drives it:
    podman reads CDI specs from ``/etc/cdi`` and ``/var/run/cdi`` only (``--cdi-spec-dir`` came later),
    so the test's spec folder is bind-mounted on ``/var/run/cdi`` in a mount namespace of the test's
    own (``unshare``) and no other process on the machine sees it; the plan runs there in a child
    Python (``run_streamed`` on ``connect_podman()``). ``builder run``'s choice comes from what podman's
    Docker-compatible API answers to ``info``. That API drops a device request of driver ``cdi``
    without a word (the container starts without the node), so PodmanEngine creates such a container
    with the CLI; this test fails if it goes back to the API. Storage and run state are the test's own
    (``CONTAINERS_STORAGE_CONF``), removed after."""
    binary = shutil.which("podman")
    unshare = shutil.which("unshare")
    if binary is None or unshare is None or os.geteuid() != 0:
        fail_or_skip("needs root, podman (apt-get install podman) and unshare")
    state = Path(tempfile.mkdtemp(prefix="mlb-cdi-podman-", dir="/var/tmp"))
    (state / "storage.conf").write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{state / "root"}"\n'
                                        f'runroot = "{state / "run"}"\n')
    env = {**os.environ, "CONTAINERS_STORAGE_CONF": str(state / "storage.conf"), "TMPDIR": str(state)}
    env.pop("CONTAINER_HOST", None)
    podman = [binary]
    made = not MOUNT_POINT.exists()
    try:
        MOUNT_POINT.mkdir(exist_ok=True)  # empty outside the test's namespace

        def in_namespace(*argv: str) -> subprocess.CompletedProcess[str]:
            script = f'mount --bind "$0" {MOUNT_POINT} && exec "$@"'
            return subprocess.run([unshare, "--mount", "--propagation", "private", "sh", "-c", script, str(test_spec),
                                   *argv], capture_output=True, text=True, check=False, timeout=300, env=env)

        info = podman_info(podman, state, env)
        plan = cdi_plan(project, tmp_path, test_spec, info)
        tar = tmp_path / "busybox.tar"
        with tarfile.open(tar, "w") as archive:
            archive.add(busybox_binary(), arcname="bin/busybox")
        imported = in_namespace(*podman, "import", "--change", 'ENTRYPOINT ["/bin/busybox"]', str(tar), plan.image)
        assert imported.returncode == 0, imported.stderr

        def run(spec: RunSpec) -> subprocess.CompletedProcess[str]:
            pickled = tmp_path / "plan.pickle"
            pickled.write_bytes(pickle.dumps(spec))
            return in_namespace(sys.executable, "-c", RUN_WITH_PODMAN, str(pickled))

        ran = run(plan)
        assert ran.returncode == 0 and NODE.search(ran.stdout), ran.stdout + ran.stderr
        without = run(dataclasses.replace(plan, cdi_devices=()))
        assert without.returncode != 0 and "/dev/accel-test0: No such file or directory" in without.stderr
        left = subprocess.run([*podman, "ps", "-aq"], capture_output=True, text=True, check=False, env=env).stdout
        assert not left.split(), f"containers left behind: {left}"
    finally:
        subprocess.run([*podman, "rmi", "--all", "--force"], capture_output=True, check=False, timeout=120, env=env)
        shutil.rmtree(state, ignore_errors=True)
        if made:
            with contextlib.suppress(OSError):
                MOUNT_POINT.rmdir()


def podman_info(podman: list[str], state: Path, env: dict[str, str]) -> dict:
    """``info`` from podman's Docker-compatible API (what docker-py gets from ``podman system service``)."""
    sock = state / "api.sock"
    service = subprocess.Popen([*podman, "system", "service", "--time", "0", f"unix://{sock}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert service.poll() is None and time.monotonic() < deadline, "podman system service did not start"
            time.sleep(0.2)
        with contextlib.closing(docker.DockerClient(base_url=f"unix://{sock}", timeout=60)) as client:
            return dict(client.info())
    finally:
        service.terminate()
        service.wait(timeout=30)
