"""scripts/setup-host.sh on a machine that already has Docker CE: its engine is used as it is, nothing
conflicting is installed beside it, and apt never removes a package (issue 31).

Where it runs: in a Debian 12 chroot that mmdebstrap makes for this module (the host's own suite),
never on the host itself. The script installs and removes real packages, and the stand-in for
Docker's containerd.io conflicts with Debian's containerd and runc, which the host's docker.io (the
engine the rest of the suite uses) needs: installed on the host, it would take the engine away, and
a failing script would too. ``apt-get -s`` would run no postinst and prove nothing about what
dpkg does. In the chroot the script does everything for real: apt-get update against Debian's
mirror (bookworm, trixie, trixie-security), apt-get install, dpkg, the services' postinst; the
host is left as it was (the chroot is a folder under the test's tmp, removed after; nothing is
mounted into it).

The stand-ins (small packages dpkg-deb builds here, each saying so in its description):

- ``containerd.io`` declares what Docker's containerd.io declares (docker/containerd-packaging,
  debian/control): ``Provides``, ``Conflicts`` and ``Replaces: containerd, runc``. It stands for
  the containerd.io of Docker's install guide.
- ``docker-ce`` (Depends: containerd.io) ships a ``/usr/bin/docker`` that answers like Docker CE
  28.5.1 with buildx: it stands for Docker's engine, running.
- The suite's other packages (mmdebstrap, slurm-wlm, qemu-user-static, cosign, ...) are empty
  stand-ins marked installed, so that the chroot does not download hundreds of MB; pigz alone
  comes from Debian, for real.
- ``docker-registry``, in a local apt repository: its postinst asks policy-rc.d whether it may
  start the service (what invoke-rc.d and deb-systemd-invoke ask) and records the answer.

Before issue 31 the script asked apt for docker.io, containerd and docker-buildx beside
containerd.io with ``apt-get -y`` (output to /dev/null), and apt removed containerd.io.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.support import REPO, fail_or_skip

pytestmark = pytest.mark.slow

SCRIPT = REPO / "scripts" / "setup-host.sh"
#: What Docker's containerd.io declares (docker/containerd-packaging debian/control).
CONTAINERD_IO = {"Provides": "containerd, runc", "Conflicts": "containerd, runc", "Replaces": "containerd, runc"}
#: Installed as empty stand-ins (the suite's packages the chroot need not download).
PRESENT = ["mmdebstrap", "arch-test", "busybox-static", "qemu-user-static", "skopeo", "slurm-wlm", "munge",
           "cosign", "oras"]
DOCKER = """#!/bin/sh
# Stand-in (ml-image-builder tests): Docker CE 28.5.1's client (or the version in /etc/standin-docker-version),
# its engine answering, buildx there.
case "$*" in
  "version --format {{.Server.Version}}") cat /etc/standin-docker-version 2>/dev/null || echo 28.5.1 ;;
  "buildx version") echo "github.com/docker/buildx v0.29.1 stand-in" ;;
  *) echo "stand-in docker: $*" >&2; exit 1 ;;
esac
"""
REGISTRY_POSTINST = """#!/bin/sh
# Stand-in (ml-image-builder tests): what docker-registry's postinst asks before it starts the service.
if [ -x /usr/sbin/policy-rc.d ]; then /usr/sbin/policy-rc.d docker-registry start; echo $? ; else echo none; fi \
  > /var/lib/standin-docker-registry-start
"""


def deb(folder: Path, name: str, fields: dict[str, str] | None = None, files: dict[str, str] | None = None,
        postinst: str | None = None) -> Path:
    """A stand-in .deb built with dpkg-deb: control *fields*, *files* (path: text, executable), a postinst."""
    root = folder / f"{name}-src"
    (root / "DEBIAN").mkdir(parents=True)
    control = {"Package": name, "Version": "99:0+standin", "Architecture": "all", "Maintainer": "tests <t@example>",
               **(fields or {}), "Description": f"stand-in for {name} (ml-image-builder tests/test_setup_host.py)"}
    (root / "DEBIAN" / "control").write_text("".join(f"{k}: {v}\n" for k, v in control.items()))
    if postinst:
        (root / "DEBIAN" / "postinst").write_text(postinst)
        (root / "DEBIAN" / "postinst").chmod(0o755)
    for rel, text in (files or {}).items():
        path = root / rel.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
    out = folder / f"{name}_standin_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)], check=True,
                   capture_output=True)
    return out


def local_repo(folder: Path, debs: list[Path]) -> None:
    """A flat apt repository (Packages) of *debs* in *folder*."""
    stanzas = []
    for path in debs:
        control = subprocess.run(["dpkg-deb", "-f", str(path)], check=True, capture_output=True, text=True).stdout
        data = path.read_bytes()
        shutil.copy2(path, folder / path.name)
        stanzas.append(control.rstrip("\n") + f"\nFilename: ./{path.name}\nSize: {len(data)}\n"
                       f"SHA256: {hashlib.sha256(data).hexdigest()}\n")
    (folder / "Packages").write_text("\n".join(stanzas))


class Chroot:
    def __init__(self, root: Path) -> None:
        self.root = root

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
               "LC_ALL": "C.UTF-8"}
        proc = subprocess.run(["chroot", str(self.root), *argv], env=env, capture_output=True, text=True,
                              check=False, timeout=900)
        assert not check or proc.returncode == 0, f"{argv}: {proc.stdout}{proc.stderr}"
        return proc

    def installed(self, package: str) -> bool:
        status = self.run("dpkg-query", "-W", "-f=${Status}", package, check=False).stdout
        return status.endswith("ok installed")

    def setup_host(self) -> subprocess.CompletedProcess[str]:
        shutil.copy2(SCRIPT, self.root / "tmp" / "setup-host.sh")
        return self.run("bash", "/tmp/setup-host.sh", check=False)


@pytest.fixture(scope="module")
def chroot(tmp_path_factory) -> Iterator[Chroot]:
    """A Debian 12 chroot (the host's suite) with Docker CE's stand-ins installed and the rest present."""
    if os.geteuid() != 0 or shutil.which("mmdebstrap") is None or shutil.which("dpkg-deb") is None:
        fail_or_skip("needs root, mmdebstrap and dpkg-deb (scripts/setup-host.sh installs mmdebstrap; .ci/run is root)")
    folder = tmp_path_factory.mktemp("setup-host")
    root = folder / "root"
    made = subprocess.run(["mmdebstrap", "--variant=apt", "--mode=root", "--include=python3", "-q",
                           "bookworm", str(root)],
                          capture_output=True, text=True, check=False, timeout=1200)
    if made.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        fail_or_skip(f"mmdebstrap bookworm failed (is Debian's mirror reachable?): {made.stderr[-800:]}")
    try:
        shutil.copy2("/etc/resolv.conf", root / "etc" / "resolv.conf")
        debs = folder / "debs"
        debs.mkdir()
        installed = [deb(debs, "containerd.io", CONTAINERD_IO),
                     deb(debs, "docker-ce", {"Depends": "containerd.io"}, {"/usr/bin/docker": DOCKER}),
                     *(deb(debs, name) for name in PRESENT)]
        repo = root / "srv" / "standin"
        repo.mkdir(parents=True)
        local_repo(repo, [deb(debs, "docker-registry", postinst=REGISTRY_POSTINST)])
        (root / "etc/apt/sources.list.d/standin.list").write_text("deb [trusted=yes] file:/srv/standin ./\n")
        for path in installed:
            shutil.copy2(path, root / "tmp" / path.name)
        chroot = Chroot(root)
        chroot.run("dpkg", "-i", *(f"/tmp/{p.name}" for p in installed))
        yield chroot
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_docker_ce_is_used_as_it_is_and_kept(chroot):
    """containerd.io and docker-ce (28.5.1, answering) are there: they stay, Debian's engine is not
    installed, the script says so; the tools it lacks come from apt (trixie with trixie-security on
    Debian 12), and the docker-registry it installs is never started by its postinst."""
    assert chroot.installed("containerd.io") and not chroot.installed("pigz")
    proc = chroot.setup_host()
    out = proc.stdout + proc.stderr
    assert chroot.installed("containerd.io") and chroot.installed("docker-ce"), out
    assert not any(chroot.installed(p) for p in ("docker.io", "containerd", "runc", "docker-buildx")), out
    assert ("setup-host: using the engine that is there, Docker's own packages (docker-ce containerd.io), as it is: "
            "not installing docker.io containerd docker-buildx beside it") in out
    assert proc.returncode == 0, out
    assert chroot.installed("pigz") and chroot.installed("docker-registry"), out
    sources = (chroot.root / "etc/apt/sources.list.d/ml-image-builder-trixie.sources").read_text()
    pin = (chroot.root / "etc/apt/preferences.d/ml-image-builder-trixie").read_text()
    assert "Suites: trixie-security" in sources and "Pin: release n=trixie-security" in pin
    assert ("Package: docker.io containerd docker-buildx cosign oras pigz\nPin: release n=trixie-security\n"
            "Pin-Priority: 500") in pin
    assert "trixie-security/main" in chroot.run("apt-cache", "policy").stdout  # apt reads it
    policy = chroot.run("apt-cache", "policy", "pigz").stdout
    assert "trixie/main" in policy and policy.split("Installed: ")[1].split()[0] != "2.6-1", policy  # not bookworm's
    # The postinst asked policy-rc.d and was refused (101); the script's policy-rc.d is gone after.
    assert (chroot.root / "var/lib/standin-docker-registry-start").read_text().strip() == "101"
    assert "the install does not start docker-registry" in out
    assert not (chroot.root / "usr/sbin/policy-rc.d").exists()


def test_a_conflict_stops_with_one_line_and_removes_nothing(chroot, tmp_path):
    """A package that conflicts with a tool the script installs (pigz): apt's --no-remove stops the
    install, apt's own output is shown, one line says nothing was removed, and the package stays."""
    chroot.run("dpkg", "--purge", "pigz", check=False)
    blocker = deb(tmp_path, "pigz-blocker", {"Conflicts": "pigz"})
    shutil.copy2(blocker, chroot.root / "tmp" / blocker.name)
    chroot.run("dpkg", "-i", f"/tmp/{blocker.name}")
    try:
        proc = chroot.setup_host()
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1, out
        assert chroot.installed("pigz-blocker") and not chroot.installed("pigz"), out
        assert "remove is disabled" in out.lower() or "removed" in out, out  # apt's own words, not thrown away
        lines = [line for line in out.splitlines() if line.startswith("setup-host: apt-get cannot install")]
        assert len(lines) == 1 and "nothing was removed" in lines[0], out
    finally:
        chroot.run("dpkg", "--purge", "pigz-blocker", check=False)


def test_the_ci_pidfile_is_not_a_predictable_name(tmp_path):
    """.ci/run's SETUP_HOST_PIDFILE line, run twice as .ci/run runs it: a new file of its own each
    time (mktemp: random name, 0600), never a name another user could create first (before:
    ``ci-dockerd.<pid>.pid``)."""
    line = next(line for line in (REPO / ".ci" / "run").read_text().splitlines()
                if line.startswith(("SETUP_HOST_PIDFILE=", "export SETUP_HOST_PIDFILE=")))
    made = []
    for _ in range(2):
        proc = subprocess.run(["bash", "-c", f'set -eu; {line}; echo "$SETUP_HOST_PIDFILE"; echo $$'],
                              env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True, text=True, check=True)
        path, pid = proc.stdout.split()
        assert Path(path).is_file() and (Path(path).stat().st_mode & 0o777) == 0o600, line
        assert pid not in Path(path).name
        made.append(path)
    assert made[0] != made[1]


def test_the_daemon_json_an_earlier_setup_host_wrote_gets_the_cache_bound_and_a_users_is_kept(chroot):
    """A machine set up by an earlier version holds its daemon.json (the containerd store, no bound on
    BuildKit's cache): that file, byte for byte, is the script's own and gets the bound, the store
    unchanged. Any other daemon.json is the user's: left as it is, with the line to add printed."""
    daemon = chroot.root / "etc" / "docker" / "daemon.json"
    daemon.parent.mkdir(parents=True, exist_ok=True)
    daemon.write_text('{\n  "features": {"containerd-snapshotter": true}\n}\n')
    out = chroot.setup_host()
    assert json.loads(daemon.read_text()) == {"features": {"containerd-snapshotter": True},
                                              "builder": {"gc": {"enabled": True, "defaultKeepStorage": "30GB"}}}
    assert "added BuildKit's 30GB bound to /etc/docker/daemon.json" in out.stdout + out.stderr
    users = '{"features": {"containerd-snapshotter": true}, "log-level": "warn"}\n'
    daemon.write_text(users)
    out = chroot.setup_host()
    assert daemon.read_text() == users
    assert "BuildKit's cache is unbounded here: add" in out.stdout + out.stderr


def test_docker_before_28_2_gets_cdi_merged_into_its_daemon_json(chroot):
    """Docker 26.1 reads CDI specs only with ``"features": {"cdi": true}``: the script merges it into
    the daemon.json that is there (the user's keys and features stay), makes one where there is none,
    leaves a ``"cdi"`` the file sets (false too) and a file that is not JSON as they are (with the line
    to add), and says it holds from dockerd's next start. From 28.2 (the stand-in's default, 28.5.1)
    CDI is on by default and the file is not touched (the tests above)."""
    daemon = chroot.root / "etc" / "docker" / "daemon.json"
    daemon.parent.mkdir(parents=True, exist_ok=True)
    version = chroot.root / "etc" / "standin-docker-version"
    version.write_text("26.1.5\n")
    try:
        daemon.write_text('{"features": {"containerd-snapshotter": true}, "log-level": "warn"}\n')
        out = chroot.setup_host()
        assert out.returncode == 0, out.stdout + out.stderr
        assert json.loads(daemon.read_text()) == {"features": {"containerd-snapshotter": True, "cdi": True},
                                                  "log-level": "warn"}, out.stderr
        assert ("setup-host: turned on Docker's CDI (\"features\": {\"cdi\": true}) in /etc/docker/daemon.json: "
                "CDI device names work from dockerd's next start") in out.stderr
        merged = daemon.read_text()
        again = chroot.setup_host()
        assert daemon.read_text() == merged and "CDI" not in again.stderr, again.stderr
        daemon.write_text('{"features": {"cdi": false}}\n')
        chroot.setup_host()
        assert daemon.read_text() == '{"features": {"cdi": false}}\n'
        daemon.write_text("{not json\n")
        out = chroot.setup_host()
        assert daemon.read_text() == "{not json\n"
        assert "/etc/docker/daemon.json is not a JSON object: add \"features\": {\"cdi\": true} to it" in out.stderr
        daemon.unlink()
        chroot.setup_host()
        assert json.loads(daemon.read_text()) == {"features": {"cdi": True}}
    finally:
        version.unlink()
        daemon.unlink(missing_ok=True)
