"""A second, empty Docker engine beside the main one: a fresh CI runner, for tests and the bench.

It gets its own data root, exec root, socket, containerd namespace and bridge. Never
``--bridge=none``: a daemon started without a bridge deletes the host's ``docker0`` and breaks
every container of the main engine. It is stopped by pid (dockerd, then its containerd),
its mounts are unmounted and its folders removed.

Example:
    >>> with extra_dockerd(Path("/tmp/x"), "a") as host:  # doctest: +SKIP
    ...     docker.DockerClient(base_url=host).ping()
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import docker


#: The DOCKER_HOST of every engine :func:`extra_dockerd` started in this process, and the variable
#: that names one a parent process started for this one (:mod:`devtools.classic`): the builder's
#: records of what it made there go with the engine (tests/conftest.py).
STARTED: list[str] = []
THROWAWAY_ENV = "MLB_THROWAWAY_DOCKER_HOST"


class DockerdUnavailable(RuntimeError):
    """A second engine can't be started here; the message names the fix."""


def privileged() -> list[str]:
    """The prefix that runs dockerd, kill and umount as root: nothing as root, else passwordless sudo."""
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True, check=False).returncode == 0:
        return ["sudo", "-n"]
    raise DockerdUnavailable("a second dockerd needs root or passwordless sudo")


def _quiet(argv: list[str]) -> None:
    """Best effort (teardown): the process may be gone, the mount or folder absent."""
    subprocess.run(argv, capture_output=True, check=False)


def _pid(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _answers(host: str) -> bool:
    try:
        with contextlib.closing(docker.DockerClient(base_url=host, timeout=10)) as client:
            return bool(client.ping())
    except docker.errors.DockerException:
        return False


@contextlib.contextmanager
def extra_dockerd(folder: Path, label: str, store: str = "classic",
                  cdi_spec_dirs: Sequence[Path] = ()) -> Iterator[str]:
    """Start an empty dockerd (data under *folder*); yield its DOCKER_HOST; remove every trace after.

    *label* (a few letters) tells concurrent ones apart in names that have length limits;
    *store* is its image store: ``classic`` (overlay2) or ``containerd`` (the snapshotter);
    *cdi_spec_dirs*: turn CDI on (``"features": {"cdi": true}``, which Docker before 28.2 needs)
    and read CDI specs from these folders instead of ``/etc/cdi`` and ``/var/run/cdi``.
    """
    binary = shutil.which("dockerd") or next(
        (p for p in ("/usr/sbin/dockerd", "/usr/bin/dockerd") if Path(p).is_file()), None)
    if binary is None:
        raise DockerdUnavailable("dockerd is not installed (apt-get install docker.io)")
    sudo = privileged()
    data = folder / f"dockerd-{label}"
    data.mkdir(parents=True, exist_ok=True)
    short = Path(tempfile.mkdtemp(prefix=f"mlb-{label}-", dir="/tmp"))  # socket paths: at most 108 bytes
    sock, pidfile = short / "docker.sock", short / "docker.pid"
    features = {"containerd-snapshotter": store == "containerd"}
    config: dict[str, object] = {"features": features}
    if cdi_spec_dirs:
        features["cdi"] = True
        config["cdi-spec-dirs"] = [str(d) for d in cdi_spec_dirs]
    (short / "daemon.json").write_text(json.dumps(config) + "\n")  # not the host's daemon.json
    bridge = f"mlb{label}{os.getpid() % 100000}"[:15]  # interface names: at most 15 bytes
    namespace = f"mlb-{label}-{os.getpid()}"  # never containerd's "moby" namespace of the main engine
    subprocess.run([*sudo, "ip", "link", "add", bridge, "type", "bridge"], check=True)
    argv = [*sudo, binary, "--data-root", str(data / "root"), "--exec-root", str(short / "exec"),
            "--pidfile", str(pidfile), "-H", f"unix://{sock}", "--config-file", str(short / "daemon.json"),
            "--bridge", bridge, "--iptables=false", "--ip-masq=false",
            "--containerd-namespace", namespace, "--containerd-plugins-namespace", f"{namespace}-plugins"]
    host, log = f"unix://{sock}", data / "dockerd.log"
    with log.open("wb") as handle:
        proc = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not _answers(host):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise DockerdUnavailable(f"dockerd {label} did not come up on {host}: {log.read_text()[-1500:]}")
            time.sleep(0.5)
        STARTED.append(host)
        yield host
    finally:
        _stop(proc, pidfile, [data / "root", short], sudo)
        _quiet([*sudo, "ip", "link", "delete", bridge])
        _quiet([*sudo, "rm", "-rf", str(data)])


def _stop(proc: subprocess.Popen[bytes], pidfile: Path, folders: list[Path], sudo: list[str]) -> None:
    """TERM (then KILL) dockerd and its containerd by pid, unmount leftovers, remove *folders*."""
    daemon = _pid(pidfile) or str(proc.pid)  # under sudo, proc is sudo itself
    containerd = _pid(folders[1] / "exec" / "containerd" / "containerd.pid")
    _quiet([*sudo, "kill", "-TERM", daemon])
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        _quiet([*sudo, "kill", "-KILL", daemon])
        proc.wait(timeout=10)
    if containerd and Path(f"/proc/{containerd}").exists():  # a dockerd killed hard leaves its containerd
        _quiet([*sudo, "kill", "-KILL", containerd])
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for point in sorted((m for m in mounts if any(m.startswith(str(f)) for f in folders)), key=len, reverse=True):
        _quiet([*sudo, "umount", "-l", point])
    for folder in folders:
        _quiet([*sudo, "rm", "-rf", str(folder)])
