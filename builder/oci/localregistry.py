"""The builder's loopback registry: Debian's ``docker-registry``, started on demand as a detached daemon,
with a login.

Its folder (:func:`builder.oci.loopback.folder`: configuration, data, log, PID file, login) is the
user's, one per port; the registry outlives the ``builder`` process that started it. It answers no
request without the login (``auth: htpasswd``) and deletes nothing through its API.

A registry answering on a loopback port is not trusted for answering: the builder pushes to it and
reads from it only when it refuses a request without a login and takes the one the builder holds
(:func:`check`: its own, or the user's ``docker login``); else another process holds the port. One
an earlier builder started without a login is restarted with one (:func:`ensure_local`).

A run that starts or checks it for a push holds it (a run lease in the ``registry`` ledger,
:class:`builder.config.ownership.Ledger`) until the run ends: ``builder gc`` never stops it under
another run (:func:`held_by_others`), and stops and starts it under the folder's lock, which
:func:`ensure_local` takes too (:func:`collect_garbage`).

Its folder: ``config.yml`` (what :func:`start` writes), ``data/`` (the storage), ``registry.log``,
``registry.pid``, the login (``password``, ``htpasswd``: :mod:`builder.oci.loopback`) and ``.lock``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from builder.config.errors import UserError
from builder.config.files import atomic_write, locked
from builder.config.ownership import Ledger, run_state, run_token
from builder.oci import loopback
from builder.oci.registry import Ref, accepts, credentials, is_local, ping
from builder.oci.secrets import PLAIN, child_env

#: How long a registry gets to stop after SIGTERM.
STOP_S = 10.0
#: The ledger of the registry folders runs hold (key: the folder).
LEDGER = "registry"
#: Hosts :func:`check` passed in this process.
_CHECKED: set[str] = set()


def ensure_local(host: str) -> str | None:
    """Make sure the registry on *host* answers and is one to push to: on loopback, the builder's own
    (started if nothing answers, restarted with a login if an earlier builder ran it without one) or
    one that takes a login the builder holds (:func:`check`); this run holds it until it ends.

    Returns a line saying what happened, or None when there is nothing to say.
    """
    if not is_local(host):
        if ping(host):
            return None
        raise UserError(f"registry {host} is unreachable; check 'registry' in matrix.yaml and the network")
    where = loopback.private_folder(loopback.folder(host))
    with locked(where / ".lock"):  # two builds at once start one registry: the second finds it answering
        said = [_migrate(host, where)]
        if not ping(host):
            said.append(start(where, host))
        check(host)
        Ledger(LEDGER).record(str(where), hold=True)
    return "; ".join(line for line in said if line) or None


def check(host: str) -> None:
    """The registry on the loopback *host* refuses a request without a login and takes the login the
    builder holds for it; else a :class:`UserError` naming who holds the port and the fix."""
    if host in _CHECKED:
        return
    fix = ("stop it, or choose another port in matrix.yaml (registry: localhost:<port>/<repository>): "
           "the builder then starts its own registry there")
    if accepts(host, None):
        raise UserError(f"another process holds {host}: the registry there answers without a login, so anyone "
                        f"on this host can push under your image names; {fix}")
    creds = credentials(host)
    if creds is None:
        raise UserError(f"registry {host} takes no request without a login, and the builder holds none for it: if "
                        f"it is yours, docker login {host} (or set BUILDER_REGISTRY_USER and BUILDER_REGISTRY_PASSWORD); "
                        f"else another process holds the port: {fix}")
    if not accepts(host, creds):
        where = loopback.folder(host)
        own = creds == loopback.login(host)
        pid = running(where) if own else None
        whose = f" (pid {pid}, started by the builder from {where}: kill {pid})" if pid else ""
        login = f"its own, {where / 'password'}" if own else f"your docker login or BUILDER_REGISTRY_* for {host}"
        raise UserError(f"another process holds {host}: the registry there{whose} refuses the builder's login "
                        f"({login}); {fix}")
    _CHECKED.add(host)


def start(where: Path, host: str) -> str:
    """Start the registry of *where* on *host*'s port, with its login (:func:`builder.oci.loopback.make_login`);
    call it under the folder's lock. Returns the line saying so."""
    binary = shutil.which("docker-registry")
    if binary is None:
        raise UserError(
            f"no registry answers at {host} and docker-registry is not installed: apt-get install docker-registry"
        )
    loopback.make_login(where)
    config = where / "config.yml"
    atomic_write(config, (
        f"version: 0.1\nlog: {{level: warn}}\nstorage:\n  filesystem: {{rootdirectory: {where / 'data'}}}\n"
        f"  delete: {{enabled: false}}\nhttp: {{addr: '127.0.0.1:{loopback.port(host)}'}}\n"
        f"auth:\n  htpasswd:\n    realm: ml-image-builder\n    path: {where / 'htpasswd'}\n"), mode=0o600)
    with open(where / "registry.log", "ab") as log:
        # Next to nothing of this process's environment: the registry outlives the run, and reads only its
        # config (REGISTRY_* variables would override it).
        env = child_env(PLAIN)
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=log, start_new_session=True,
                                env=env, cwd=where)
    (where / "registry.pid").write_text(str(proc.pid))
    for _ in range(50):
        if ping(host, timeout=0.5):
            return (f"started a local registry on {host} (pid {proc.pid}, data in {where}; login: user "
                    f"{loopback.USER}, password in {where / 'password'})")
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise UserError(f"the local registry on {host} did not start; see {where / 'registry.log'}")


def _migrate(host: str, where: Path) -> str | None:
    """An earlier builder's registry in *where*, running without a login: stopped (it is started
    again with one). Returns the line saying so; a :class:`UserError` when it does not stop."""
    config = where / "config.yml"
    try:
        anonymous = "htpasswd" not in config.read_text(encoding="utf-8")
    except OSError:
        return None
    pid = running(where)
    if not anonymous or pid is None:
        return None
    if not stop(pid):
        raise UserError(f"the local registry on {host} (pid {pid}, from {where}) takes pushes without a login and "
                        f"did not stop within {STOP_S:.0f} s: stop it (kill {pid}) and run again")
    return (f"stopped the local registry on {host} (pid {pid}), which an earlier builder ran without a login; "
            "what it holds counts as tested only where this builder recorded it")


def running(where: Path) -> int | None:
    """The PID of the registry started from *where* (its PID file, and a process serving that
    folder's config), if it runs."""
    try:
        pid = int((where / "registry.pid").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if str(where / "config.yml").encode() in cmdline else None


def stop(pid: int) -> bool:
    """SIGTERM *pid* and wait up to :data:`STOP_S` seconds; whether it stopped."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + STOP_S
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


def held_by_others(where: Path) -> bool:
    """Whether a run other than this one holds the registry of *where* (it pushes there, or may)."""
    record = Ledger(LEDGER).records().get(str(where))
    me = run_token()
    return record is not None and any(r != me and run_state(r) != "gone" for r in record.runs)


def own_folder(registry: str) -> Path | None:
    """The folder of the builder's own registry that the matrix's *registry* (``host:port/repository``)
    names, when it is a loopback one the builder started (its ``config.yml`` is there); else None."""
    host = Ref.parse(registry).host
    if not is_local(host):
        return None
    where = loopback.folder(host)
    return where if (where / "config.yml").is_file() else None


def unreferenced_blobs(where: Path) -> list[tuple[str, int]]:
    """``garbage-collect --dry-run`` of the registry of *where*: (digest, bytes) of each blob no manifest
    references; none when docker-registry is not installed."""
    binary = shutil.which("docker-registry")
    if binary is None:
        return []
    proc = subprocess.run([binary, "garbage-collect", "--dry-run", str(where / "config.yml")],
                          capture_output=True, text=True, check=False, env=child_env(PLAIN))
    blobs = where / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256"  # the registry's own layout
    found = []
    for digest in sorted(set(re.findall(r"blob eligible for deletion: (sha256:[0-9a-f]{64})", proc.stdout + proc.stderr))):
        data = blobs / digest[7:9] / digest[7:] / "data"
        found.append((digest, data.stat().st_size if data.is_file() else 0))
    return found


def collect_garbage(where: Path) -> str | None:
    """``garbage-collect`` the registry of *where*: with it stopped (its docs ask it stopped or
    read-only), and started again when it ran. Returns why nothing was collected (another run holds
    the registry, it did not stop, garbage-collect failed), or None.

    Under the folder's lock, which a run that starts or checks the registry takes too: no run starts
    pushing to it while it is stopped here.
    """
    binary = shutil.which("docker-registry")
    if binary is None:
        return "docker-registry is not installed"
    with locked(where / ".lock"):
        if held_by_others(where):
            return "another build holds the registry (it pushes there): run builder gc when it is done"
        pid = running(where)
        if pid is not None and not stop(pid):
            return f"the registry (pid {pid}) did not stop within {STOP_S:.0f} s, and garbage-collect needs it stopped"
        try:
            proc = subprocess.run([binary, "garbage-collect", str(where / "config.yml")], capture_output=True,
                                  text=True, check=False, env=child_env(PLAIN))
        finally:
            if pid is not None:
                start(where, f"127.0.0.1:{where.name.removeprefix('registry-')}")
        if proc.returncode != 0:
            said = (proc.stderr or proc.stdout).strip().splitlines()
            return f"docker-registry garbage-collect failed: {said[-1] if said else f'exit {proc.returncode}'}"
    return None
