"""The real cpu image under a scheduler's rules: tini as PID 1 turns SIGTERM (docker stop, Slurm
preemption, Kubernetes pod termination) into the command's exit or its handler, and reaps
orphans; any UID gets a writable HOME; `builder run` writes files as the invoking user.

Exit statuses, not timings, prove the signal path: a command killed by the engine after the
stop timeout exits 137 (SIGKILL); one that SIGTERM reached through tini exits 143.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from builder.config.project import load_project
from builder.host import launch
from builder.host.runspec import format_dry_run, run_spec

pytestmark = pytest.mark.engine

HANDLER = """
import signal, sys, time
def stop(signum, frame):
    print("checkpoint saved on signal", signum, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(600)
"""
# The intermediate child exits at once, so its child is orphaned, then exits: only an init
# that reaps (tini) keeps it from staying a zombie. Counts zombies after a moment.
ORPHAN = """
import os, time
if os.fork() == 0:
    if os.fork() == 0:
        time.sleep(0.3)
        os._exit(0)
    os._exit(0)
os.wait()
time.sleep(1.5)
states = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        states.append(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0])
    except OSError:
        pass
print("zombies", states.count("Z"), flush=True)
"""


@pytest.fixture
def cpu_image(cpu_project) -> str:
    return yaml.safe_load((cpu_project / "matrix.yaml").read_text())["registry"] + ":cpu"


@pytest.fixture
def started(engine, no_leftovers) -> Iterator[list]:
    """Containers a test starts; removed afterwards whatever happened."""
    containers: list = []
    yield containers
    for container in containers:
        container.remove(force=True)


def _wait_for_log(container, text: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in container.logs().decode(errors="replace"):
            return
        container.reload()
        assert container.status == "running", container.logs().decode(errors="replace")[-2000:]
        time.sleep(0.2)
    pytest.fail(f"{text!r} never appeared in the container's output")


def test_docker_stop_reaches_a_command_without_handler(engine, cpu_image, started):
    container = engine.client.containers.run(cpu_image, ["sleep", "600"], detach=True,
                                      environment={"RUNTIME_CHECK_MODE": "off"})
    started.append(container)
    top = engine.client.api.top(container.id)["Processes"]
    assert "tini" in " ".join(top[0]), top  # PID 1 is the init, the command its child
    container.stop(timeout=10)
    assert container.wait(timeout=30)["StatusCode"] == 143  # SIGTERM, not the engine's SIGKILL (137)


def test_docker_stop_runs_the_commands_handler(engine, cpu_image, started):
    container = engine.client.containers.run(cpu_image, ["python", "-c", HANDLER], detach=True,
                                      environment={"RUNTIME_CHECK_MODE": "off"})
    started.append(container)
    _wait_for_log(container, "ready")
    container.stop(timeout=10)
    assert container.wait(timeout=30)["StatusCode"] == 0
    assert "checkpoint saved on signal 15" in container.logs().decode()


def test_orphans_are_reaped(engine, cpu_image, started):
    container = engine.client.containers.run(cpu_image, ["python", "-c", ORPHAN], detach=True,
                                      environment={"RUNTIME_CHECK_MODE": "off"})
    started.append(container)
    assert container.wait(timeout=120)["StatusCode"] == 0
    assert "zombies 0" in container.logs(stderr=False).decode()


def test_any_uid_gets_a_writable_home(engine, cpu_image, started):
    code = "import pathlib; p = pathlib.Path.home() / 'x'; p.write_text('ok'); print(p, p.read_text())"
    container = engine.client.containers.run(cpu_image, ["python", "-c", code], user="4242:4242", detach=True)
    started.append(container)
    status = container.wait(timeout=300)["StatusCode"]
    out = container.logs(stderr=False).decode()
    assert status == 0, container.logs().decode()[-2000:]
    assert out.strip() == "/tmp/home-4242/x ok"


def test_builder_run_writes_as_the_invoking_user(engine, cpu_project, tmp_path, started, monkeypatch):
    """The CLI's own user choice (as UID 1000) and a real container writing into a 0755 folder of UID 1000.

    The test process is root, which `builder run` maps to the image's user; the UID 1000 case is
    taken by pretending the invoking user is 1000 (the CLI reads os.getuid/os.getgid).
    """
    workdir = tmp_path / "mine"
    workdir.mkdir(mode=0o755)
    os.chown(workdir, 1000, 1000)
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    monkeypatch.setattr(os, "getgid", lambda: 1000)
    project = load_project(cpu_project / "matrix.yaml")
    plan = run_spec(project, ["python", "-c", "open('ckpt.pt', 'w').write('x')"], target="cpu",
                             cwd=workdir)
    assert plan.user == "1000:1000" and "--user 1000:1000" in format_dry_run(plan)
    monkeypatch.undo()
    status = launch.launch(plan, say=lambda line: None)
    assert status == 0
    ckpt = Path(workdir / "ckpt.pt")
    assert ckpt.read_text() == "x" and (ckpt.stat().st_uid, ckpt.stat().st_gid) == (1000, 1000)
    # As the image's user (what root gets), the same folder refuses the write: the reason for the default.
    image_user = run_spec(project, ["python", "-c", "open('ckpt2.pt', 'w').write('x')"], target="cpu",
                                   user="image", cwd=workdir)
    assert image_user.user is None
    assert launch.launch(image_user, say=lambda line: None) != 0
    assert not (workdir / "ckpt2.pt").exists()

