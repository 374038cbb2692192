"""Run pytest against a second engine with the classic image store: ``python -m devtools.classic [pytest args]``.

The README's test command runs the whole suite on the host's engine (the containerd image store,
as Engine 29 installs it), then the tests marked ``classic`` again here: the same dockerd binary
with its own data root, socket and bridge (devtools/dockerd.py), and ``"containerd-snapshotter":
false``, so that both stores answer every engine-facing promise (IDs, sizes, digests, pushes). The
engine is removed afterwards, whatever the tests did.

Example:
    $ python -m devtools.classic -q -m classic     # doctest: +SKIP
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from devtools.dockerd import THROWAWAY_ENV, DockerdUnavailable, extra_dockerd


def main(argv: list[str]) -> int:
    folder = Path(tempfile.mkdtemp(prefix="mlb-classic-", dir=os.environ.get("TMPDIR", "/var/tmp")))
    try:
        with extra_dockerd(folder, "cl", store="classic") as host:
            info = subprocess.run(["docker", "-H", host, "info", "--format", "{{.ServerVersion}} {{.Driver}}"],
                                  capture_output=True, text=True, check=False).stdout.strip()
            print(f"classic image store: Docker {info} at {host}", flush=True)
            return subprocess.run([sys.executable, "-m", "pytest", *argv], env={**os.environ, "DOCKER_HOST": host, THROWAWAY_ENV: host},
                                  check=False).returncode
    except DockerdUnavailable as exc:
        print(f"classic store: {exc}", file=sys.stderr)
        return 1
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
