"""A registry on loopback on demand: Debian's ``docker-registry`` started as a detached daemon.

Its configuration, data, log and PID file live under the user's state folder
(:func:`builder.config.state.state_dir`), one folder per port; it outlives the ``builder``
process that started it.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from builder.config.errors import UserError
from builder.config.files import locked
from builder.config.state import state_dir
from builder.oci.registry import is_local, ping
from builder.oci.secrets import PLAIN, child_env


def ensure_local(host: str) -> str | None:
    """Start Debian's docker-registry on *host* if it is on loopback and nothing answers.

    Returns a line saying what happened, or None when a registry already answered.
    """
    if ping(host):
        return None
    if not is_local(host):
        raise UserError(f"registry {host} is unreachable; check 'registry' in matrix.yaml and the network")
    binary = shutil.which("docker-registry")
    if binary is None:
        raise UserError(
            f"no registry answers at {host} and docker-registry is not installed: apt-get install docker-registry"
        )
    port = host.rsplit(":", 1)[-1] if ":" in host else "80"
    folder = state_dir() / f"registry-{port}"
    with locked(folder / ".lock"):  # two builds at once start one registry: the second finds it answering
        return None if ping(host) else _start(binary, host, port, folder)


def _start(binary: str, host: str, port: str, folder: Path) -> str:
    config = folder / "config.yml"
    config.write_text(
        f"version: 0.1\nlog: {{level: warn}}\nstorage:\n  filesystem: {{rootdirectory: {folder / 'data'}}}\n"
        f"  delete: {{enabled: true}}\nhttp: {{addr: '127.0.0.1:{port}'}}\n"
    )
    with open(folder / "registry.log", "ab") as log:
        proc = subprocess.Popen(
            [binary, "serve", str(config)], stdout=log, stderr=log, start_new_session=True, env=child_env(PLAIN)
        )
    (folder / "registry.pid").write_text(str(proc.pid))
    for _ in range(50):
        if ping(host, timeout=0.5):
            return f"started a local registry on {host} (pid {proc.pid}, data in {folder})"
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise UserError(f"the local registry on {host} did not start; see {folder / 'registry.log'}")
