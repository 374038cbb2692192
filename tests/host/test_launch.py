"""``builder run``: target choice and device flags per vendor (fake hosts laid out as the
kernel does, see hostlayouts.py), the ``--dry-run`` output, and real runs on the engine with
a busybox image tagged like the cpu target.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

import docker
import pytest
from click.testing import CliRunner, Result
from host.hostlayouts import H200, IGPU, MAX1550, MI300X, make_dev, make_sysfs

from builder.cli.host import run_cmd
from builder.config.errors import UserError
from builder.config.project import Project
from builder.host import hardware, launch
from builder.host.devices import device_flags
from builder.host.runspec import RUN_LABEL, format_dry_run, parse_env, run_spec
from builder.host.targets import choose_target
from builder.oci.connect import run_argv
from devtools.support import fail_or_skip

NVIDIA_NODES = ("nvidia0", "nvidiactl")
AMD_NODES = ("kfd", "dri/card0", "dri/renderD128")
INTEL_NODES = ("dri/card0", "dri/renderD128")


def fake_host(tmp_path: Path, *devices, nodes=(), gid: int | None = None) -> hardware.HostGpus:
    gid = gid if os.geteuid() == 0 else None
    return hardware.detect(
        make_sysfs(tmp_path / "sys", *devices),
        make_dev(tmp_path / "dev", *nodes, gid=gid),
        nvidia_runtime=False,
    )


# --- target choice -------------------------------------------------------------------------


def test_auto_nvidia_picks_the_latest_nvidia_target(project: Project, tmp_path: Path) -> None:
    target, why = choose_target(project, "auto", fake_host(tmp_path, H200, nodes=NVIDIA_NODES), environ={})
    assert target.name == "nvidia-cu130" and target.alias_refs
    assert why == (
        "host has usable nvidia GPU(s): 0000:19:00.0 (0x2335); "
        "nvidia-cu130 carries latest-nvidia (of nvidia-cu130, nvidia-cu118)"
    )


@pytest.mark.parametrize(
    ("devices", "nodes", "expected"),
    [
        ((MI300X,), AMD_NODES, "amd-rocm5.7"),
        ((MAX1550,), INTEL_NODES, "intel-oneapi"),
        ((IGPU, MI300X), AMD_NODES, "amd-rocm5.7"),  # discrete AMD over the Intel iGPU
        ((), (), "cpu"),
        ((H200,), (), "cpu"),  # NVIDIA card, driver not loaded
    ],
)
def test_auto_per_host(project: Project, tmp_path: Path, devices, nodes, expected: str) -> None:
    target, _ = choose_target(project, "auto", fake_host(tmp_path, *devices, nodes=nodes), environ={})
    assert target.name == expected


def test_no_gpus_and_forced_vendor(project: Project, tmp_path: Path) -> None:
    nvidia = fake_host(tmp_path, H200, nodes=NVIDIA_NODES)
    assert choose_target(project, "auto", nvidia, gpus=False, environ={}) == (
        project.target("cpu"),
        "--no-gpus",
    )
    target, why = choose_target(project, "auto", nvidia, environ={"BUILDER_VENDOR": "intel"})
    assert target.name == "intel-oneapi" and why == "forced by BUILDER_VENDOR=intel"


def test_explicit_target(project: Project, tmp_path: Path) -> None:
    assert choose_target(project, "nvidia-cu118", hardware.HostGpus())[0].name == "nvidia-cu118"
    with pytest.raises(UserError, match="unknown target 'nope'"):
        choose_target(project, "nope", hardware.HostGpus())


def test_vendor_without_target_falls_back_to_cpu(project: Project, tmp_path: Path) -> None:
    no_intel = dataclasses.replace(project, targets=[t for t in project.targets if t.vendor != "intel"])
    target, why = choose_target(no_intel, "auto", fake_host(tmp_path, MAX1550, nodes=INTEL_NODES), environ={})
    assert target.name == "cpu" and why.endswith("matrix.yaml has no intel target, so the cpu one")
    only_gpu = dataclasses.replace(project, targets=[t for t in project.targets if t.vendor != "cpu"])
    with pytest.raises(UserError, match="no cpu target to run here; add one"):
        choose_target(only_gpu, "auto", hardware.HostGpus(), environ={})


# --- device flags --------------------------------------------------------------------------


def test_nvidia_flags(project: Project, tmp_path: Path) -> None:
    plan = run_spec(
        project, ["nvidia-smi"], host=fake_host(tmp_path, H200, nodes=NVIDIA_NODES), environ={}, cwd=tmp_path
    )
    kwargs = plan.create_kwargs()
    assert kwargs["device_requests"] == [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    assert kwargs["devices"] is None and kwargs["group_add"] is None and kwargs["ipc_mode"] is None
    assert kwargs["shm_size"] == "8g"
    assert plan.problems == ()
    argv = plan.argv()
    assert argv[argv.index("--gpus") + 1] == "all"


def _host_gids(*names: str) -> set[int]:
    return {gid for gid in hardware.group_gids(names).values() if gid != 0}


def test_amd_flags(project: Project, tmp_path: Path) -> None:
    host = fake_host(tmp_path, MI300X, nodes=AMD_NODES, gid=4242)
    plan = run_spec(project, ["python", "-V"], host=host, environ={}, cwd=tmp_path)
    assert plan.target.name == "amd-rocm5.7"
    kwargs = plan.create_kwargs()
    assert kwargs["device_requests"] is None
    assert kwargs["devices"] == ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"]
    expected = _host_gids("video", "render") | ({4242} if os.geteuid() == 0 else set())
    assert set(plan.group_add) == expected and kwargs["group_add"] == [str(g) for g in sorted(expected)]
    assert kwargs["ipc_mode"] == "host" and kwargs["shm_size"] == "8g"
    assert plan.problems == ()
    if "render" not in hardware.group_gids(["render"]):
        assert "host has no 'render' group; relying on the device nodes' groups" in plan.notes


def test_intel_flags(project: Project, tmp_path: Path) -> None:
    plan = run_spec(
        project,
        ["python", "-V"],
        host=fake_host(tmp_path, MAX1550, nodes=INTEL_NODES, gid=4243),
        environ={},
        cwd=tmp_path,
    )
    kwargs = plan.create_kwargs()
    assert plan.target.name == "intel-oneapi"
    assert kwargs["devices"] == ["/dev/dri:/dev/dri:rwm"] and kwargs["ipc_mode"] is None
    assert set(plan.group_add) == _host_gids("video", "render") | ({4243} if os.geteuid() == 0 else set())


def test_cpu_flags(project: Project, tmp_path: Path) -> None:
    plan = run_spec(project, ["true"], host=hardware.HostGpus(), environ={}, cwd=tmp_path)
    kwargs = plan.create_kwargs()
    assert plan.target.name == "cpu"
    assert (kwargs["device_requests"], kwargs["devices"], kwargs["group_add"]) == (None, None, None)
    assert kwargs["shm_size"] == "2g"
    mount = kwargs["mounts"][0]
    assert (mount["Target"], mount["Source"], mount["Type"], mount["ReadOnly"]) == (
        "/workspace",
        str(tmp_path.resolve()),
        "bind",
        False,
    )
    assert kwargs["working_dir"] == "/workspace" and kwargs["command"] == ["true"]
    assert "user" not in kwargs  # the image's user 1001 stays


def test_gpu_target_on_a_host_without_it_is_refused(project: Project, tmp_path: Path) -> None:
    plan = run_spec(
        project, ["true"], target="amd-rocm5.7", host=hardware.HostGpus(), environ={}, cwd=tmp_path
    )
    assert len(plan.problems) == 3
    assert "pass --no-gpus to run it without GPUs" in plan.problems[0]
    with pytest.raises(UserError, match="target amd-rocm5.7 needs a usable amd GPU"):
        launch.launch(plan)  # refused before any engine is asked
    relaxed = run_spec(
        project,
        ["true"],
        target="amd-rocm5.7",
        gpus=False,
        host=hardware.HostGpus(),
        environ={},
        cwd=tmp_path,
    )
    assert relaxed.problems == () and relaxed.devices == () and relaxed.ipc_mode is None
    assert relaxed.notes == ("--no-gpus: running the amd image without its devices",)


def test_flags_without_the_engine_helper(project: Project) -> None:
    flags = device_flags(
        project.target("nvidia-cu130"), hardware.HostGpus(), environ={"BUILDER_VENDOR": "nvidia"}
    )
    assert flags.gpus and flags.problems == ()  # forced: trust the user, the engine will tell


# --- environment ---------------------------------------------------------------------------


def test_environment(project: Project, tmp_path: Path) -> None:
    host_env = {"MASTER_PORT": "29600", "CUDA_VISIBLE_DEVICES": "1", "HF_TOKEN": "x", "PATH": "/bin"}
    plan = run_spec(
        project,
        ["true"],
        target="nvidia-cu130",
        gpus=False,
        env=["SEED=1", "HF_TOKEN", "RANK=3"],
        host=hardware.HostGpus(),
        environ=host_env,
        cwd=tmp_path,
    )
    assert plan.environment == {
        "WORLD_SIZE": "1",
        "RANK": "3",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29600",
        "CUDA_VISIBLE_DEVICES": "1",
        "SEED": "1",
        "HF_TOKEN": "x",
    }
    with pytest.raises(UserError, match="--env NOPE: not set on the host"):
        parse_env(["NOPE"], {})
    with pytest.raises(UserError, match="expected KEY=VALUE"):
        parse_env(["=1"], {})


# --- dry run -------------------------------------------------------------------------------


def invoke_run(project_dir: Path, sysfs: Path, *args: str, env: dict[str, str | None] | None = None) -> Result:
    """`builder run` through click, on the test project and a sysfs tree of the test's."""
    argv = ["--matrix", str(project_dir / "matrix.yaml"), "--allow-unpinned", "--sysfs-root", str(sysfs), *args]
    return CliRunner().invoke(run_cmd, argv, env=env)


def test_dry_run(
    project_dir: Path, project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sysfs = make_sysfs(tmp_path / "sys", MI300X)
    dev = make_dev(tmp_path / "dev", *AMD_NODES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MASTER_PORT", "29777")
    monkeypatch.delenv("BUILDER_VENDOR", raising=False)
    # Docker's line, whichever engine answers here (with none, podman's would be planned where it is installed)
    result = invoke_run(project_dir, sysfs, "--engine", "docker", "--dev-root", str(dev), "--env", "MSG=it's here",
                        "--dry-run", "--", "python", "-c", "print(1 + 1)")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    ref = project.target("amd-rocm5.7").primary_ref
    assert lines[0] == f"# target: amd-rocm5.7 ({ref})"
    assert lines[1] == "# why: host has usable amd GPU(s): 0000:0c:00.0 (0x74a1)"
    argv = shlex.split(lines[-1])
    assert argv[:3] == ["docker", "run", "--rm"]
    assert argv[-4:] == [ref, "python", "-c", "print(1 + 1)"]
    for flag in (
        ["--device", "/dev/kfd"],
        ["--device", "/dev/dri"],
        ["--ipc", "host"],
        ["--shm-size", "8g"],
        ["--env", "MSG=it's here"],
        ["--env", "MASTER_PORT=29777"],
        ["--workdir", "/workspace"],
        ["--mount", f"type=bind,source={tmp_path.resolve()},target=/workspace"],
    ):
        assert any(argv[i : i + 2] == flag for i in range(len(argv))), flag
    assert "--gpus" not in argv


def test_rootless_podman_keeps_the_user_s_ids_and_groups(project: Project, tmp_path: Path) -> None:
    """A rootless podman runs the user's own UID as itself only with ``--userns keep-id`` (else it is a subordinate
    ID and /workspace is not writable), and keeps the user's groups (video, render) only with ``--group-add
    keep-groups`` (a host GID names a subordinate one in its user namespace); rootful, and on Docker, the GIDs."""
    host = fake_host(tmp_path, MI300X, nodes=AMD_NODES, gid=4242)
    me = f"{os.getuid()}:{os.getgid()}"
    flags = device_flags(project.target("amd-rocm5.7"), host, environ={}, engine="podman", rootless=True)
    assert flags.group_add == ("keep-groups",)
    rootful = device_flags(project.target("amd-rocm5.7"), host, environ={}, engine="podman", rootless=False)
    assert rootful.group_add and all(isinstance(g, int) for g in rootful.group_add)
    on_docker = device_flags(project.target("amd-rocm5.7"), host, environ={}, engine="docker", rootless=True)
    assert on_docker.group_add == rootful.group_add
    plan = dataclasses.replace(run_spec(project, ["id"], target="cpu", host=host, environ={}, cwd=tmp_path,
                                        engine="podman"), user=me, group_add=flags.group_add)
    argv = run_argv("podman", plan.create_kwargs(), rootless=True)
    pairs = [argv[i:i + 2] for i in range(len(argv))]
    assert argv[:3] == ["podman", "run", "--rm"] and ["--userns", "keep-id"] in pairs
    assert ["--group-add", "keep-groups"] in pairs and ["--user", me] in pairs
    assert "--userns" not in run_argv("podman", plan.create_kwargs(), rootless=False)
    assert "--userns" not in run_argv("docker", plan.create_kwargs(), rootless=True)


def test_run_needs_a_command(project_dir: Path) -> None:
    result = CliRunner().invoke(run_cmd, ["--matrix", str(project_dir / "matrix.yaml"), "--allow-unpinned"])
    assert result.exit_code == 2 and "Missing argument 'COMMAND...'" in result.output


# --- the real engine -----------------------------------------------------------------------

SCRIPT = 'echo "out $WORLD_SIZE $RANK $SEED"; echo oops >&2; cat /workspace/hello.txt; id -u; exit 7'


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    folder.chmod(0o755)  # uid 1001 in the container must enter it
    (folder / "hello.txt").write_text("hello from the host\n")
    monkeypatch.chdir(folder)
    return folder


def _left(engine: docker.DockerClient, ref: str) -> list:
    return engine.client.containers.list(all=True, filters={"label": f"{RUN_LABEL}.image={ref}"})


@pytest.mark.engine
def test_run_exit_status_output_and_cleanup(engine, image: str, project_dir: Path, workspace: Path) -> None:
    result = CliRunner().invoke(
        run_cmd,
        [
            "--matrix",
            str(project_dir / "matrix.yaml"),
            "--allow-unpinned",
            "--target",
            "cpu",
            "-e",
            "SEED=42",
            "--",
            "sh",
            "-c",
            SCRIPT,
        ],
    )
    assert result.exit_code == 7, result.output
    assert result.stdout == "out 1 0 42\nhello from the host\n1001\n"
    assert "oops\n" in result.stderr and f"builder run: cpu ({image}): --target cpu" in result.stderr
    assert _left(engine, image) == []


@pytest.mark.engine
def test_run_auto_on_a_gpu_less_host(
    engine, image: str, project_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    result = invoke_run(project_dir, tmp_path / "empty", "--", "sh", "-c", "exit 0", env={"BUILDER_VENDOR": None})
    assert result.exit_code == 0, result.output
    assert "cpu" in result.stderr and "no usable GPU on this host" in result.stderr
    assert _left(engine, image) == []


@pytest.mark.engine
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stops_and_removes(
    engine, image: str, project: Project, workspace: Path, signum: int
) -> None:
    plan = run_spec(
        project, ["sh", "-c", "echo started; sleep 60"], target="cpu", host=hardware.HostGpus()
    )

    class Sink:
        """Delivers the signal to this process as soon as the container has started talking."""

        def write(self, data: bytes) -> None:
            if b"started" in data:
                signal.raise_signal(signum)

        def flush(self) -> None:
            pass

    with pytest.raises(KeyboardInterrupt):  # Sink stands in for a binary stream: run_streamed writes, flushes
        launch.run_streamed(engine, plan, stdout=Sink(), stop_timeout=1)  # type: ignore[arg-type]
    assert _left(engine, image) == []
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handlers restored


@pytest.mark.engine
def test_missing_image_says_how_to_build_it(engine, project: Project, workspace: Path) -> None:
    plan = run_spec(project, ["true"], target="nvidia-cu118", gpus=False, host=hardware.HostGpus())
    with pytest.raises(UserError, match=r"make images TARGETS=nvidia-cu118") as info:
        launch.launch(plan, engine=engine, say=lambda line: None)
    assert plan.image in str(info.value) and "pulling it failed" in str(info.value)


@pytest.mark.engine
def test_dry_run_line_runs_the_same(engine, image: str, project: Project, workspace: Path) -> None:
    if shutil.which("docker") is None:
        # Like the engine fixture: a silent skip in CI would hide that --dry-run is never checked.
        fail_or_skip("there is no docker CLI to run the dry-run line; apt-get install docker.io")
    plan = run_spec(project, ["sh", "-c", SCRIPT], target="cpu", env=["SEED=5"], host=hardware.HostGpus())
    line = format_dry_run(plan)
    done = subprocess.run(["sh", "-c", line], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 7, done.stderr
    assert done.stdout == "out 1 0 5\nhello from the host\n1001\n"
    assert _left(engine, image) == []
