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
- ``slurm-wlm`` (Depends: slurmctld, slurmd), ``slurmctld`` and ``slurmd``, each shipping its unit,
  in the same repository (version 99:, ahead of Debian's): what apt installs where ``slurm-wlm`` is
  missing, for the masking tests.
- Debian's engine, ``docker.io`` (its ``docker`` the stand-in above), ``containerd`` and
  ``docker-buildx``, swapped in for Docker CE's where a test needs the engine this script installs.
- ``systemctl``, for the masking tests only: no systemd runs in a chroot, so a script in
  /usr/local/bin records each call and answers ``list-unit-files`` from the unit files there, as
  systemctl does (with /run/systemd/system present, the script's sign of a running systemd).

Before issue 31 the script asked apt for docker.io, containerd and docker-buildx beside
containerd.io with ``apt-get -y`` (output to /dev/null), and apt removed containerd.io. Before
issue 40 it pinned Debian 13 at 100 (apt-get upgrade moved a package installed here to Debian
13's), masked slurmd on a compute node, and rewrote daemon.json in place, Docker CE's too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
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
SYSTEMCTL = """#!/bin/sh
# Stand-in (ml-image-builder tests): systemctl, no systemd running in the chroot. Records each call;
# list-unit-files NAME answers as systemctl does where NAME's unit file is there (state, preset).
echo "$*" >>/var/lib/standin-systemctl.log
if [ "$1" = list-unit-files ]; then
  for arg; do
    case "$arg" in
      *.service)
        if [ -e "/etc/systemd/system/$arg" ] || [ -e "/lib/systemd/system/$arg" ]; then echo "$arg enabled enabled"; fi ;;
    esac
  done
fi
exit 0
"""
UNIT = "[Unit]\nDescription=stand-in (ml-image-builder tests)\n[Service]\nExecStart=/bin/true\n"
#: What scripts/setup-host.sh wrote before issue 40 (Debian 13 at 100): machines that ran it hold it.
OLD_PIN = """# Added by ml-image-builder's scripts/setup-host.sh: only the engine's packages and the tools from
# trixie and trixie-security.
Package: *
Pin: release n=trixie
Pin-Priority: 100

Package: *
Pin: release n=trixie-security
Pin-Priority: 100

Package: docker.io containerd docker-buildx cosign oras pigz
Pin: release n=trixie
Pin-Priority: 500

Package: docker.io containerd docker-buildx cosign oras pigz
Pin: release n=trixie-security
Pin-Priority: 500
"""
OLD_SOURCES = """# Added by ml-image-builder's scripts/setup-host.sh: Docker 26 and cosign/oras from Debian 13, with
# its security updates. The pin beside it (/etc/apt/preferences.d/ml-image-builder-trixie) keeps
# the rest on bookworm.
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: trixie-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
SOURCES = "etc/apt/sources.list.d/ml-image-builder-trixie.sources"
PIN = "etc/apt/preferences.d/ml-image-builder-trixie"
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

    def dpkg_i(self, *names: str) -> None:
        """Installs the stand-ins the fixture left in the chroot's /tmp."""
        self.run("dpkg", "-i", *(f"/tmp/{name}_standin_all.deb" for name in names))

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
        offered = debs / "offered"
        offered.mkdir()
        local_repo(repo, [deb(offered, "docker-registry", postinst=REGISTRY_POSTINST),
                          deb(offered, "slurm-wlm", {"Depends": "slurmctld, slurmd"}),
                          *(deb(offered, name, files={f"/lib/systemd/system/{name}.service": UNIT})
                            for name in ("slurmctld", "slurmd"))])
        debian_engine = [deb(debs, "docker.io", files={"/usr/bin/docker": DOCKER}), deb(debs, "containerd"),
                         deb(debs, "docker-buildx")]  # swapped in for Docker CE's by debian_engine()
        (root / "etc/apt/sources.list.d/standin.list").write_text("deb [trusted=yes] file:/srv/standin ./\n")
        for path in [*installed, *debian_engine]:
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
    for suite in ("trixie", "trixie-security"):  # below an installed version's 100; the engine and tools at 500
        assert f"Package: *\nPin: release n={suite}\nPin-Priority: 1\n" in pin
        assert (f"Package: docker.io containerd docker-buildx cosign oras pigz\nPin: release n={suite}\n"
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


def test_the_trixie_pin_never_replaces_a_version_installed_here(chroot, tmp_path):
    """A machine an earlier version set up holds its pin (Debian 13 at 100) and a package installed at
    a version bookworm does not offer (a backport, one built by hand): ``bash-completion`` (all
    architectures, no dependencies: trixie's installs on bookworm) between bookworm's and trixie's. At 100 ``apt-get upgrade`` moves it to Debian 13's; after this run the pin is
    rewritten (Debian 13 at 1) and apt keeps it, while the engine's packages still come from trixie."""
    sources, pin = chroot.root / SOURCES, chroot.root / PIN
    sources.write_text(OLD_SOURCES)
    pin.write_text(OLD_PIN)
    chroot.run("apt-get", "update", "-qq")
    offered = {line.split("|")[2].split()[1]: line.split("|")[1].strip()
               for line in chroot.run("apt-cache", "madison", "bash-completion").stdout.splitlines() if "/main" in line}
    version = f"{offered['trixie/main']}~local1"  # newer than bookworm's, older than trixie's
    assert chroot.run("dpkg", "--compare-versions", offered["bookworm/main"], "lt", version, check=False).returncode == 0
    shutil.copy2(deb(tmp_path, "bash-completion", {"Version": version}),
                 chroot.root / "tmp" / "bash-completion_standin_all.deb")
    chroot.dpkg_i("bash-completion")
    try:
        assert f"Inst bash-completion [{version}] ({offered['trixie/main']} " in chroot.run("apt-get", "-s", "upgrade").stdout
        proc = chroot.setup_host()
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        assert "setup-host: lowered Debian 13's suites to priority 1 in /etc/apt/preferences.d/ml-image-builder-trixie" in out
        assert "Pin-Priority: 100" not in pin.read_text() and sources.read_text() == OLD_SOURCES
        upgrade = chroot.run("apt-get", "-s", "upgrade").stdout
        assert "Inst bash-completion " not in upgrade, upgrade
        assert f"Installed: {version}\n  Candidate: {version}\n" in chroot.run("apt-cache", "policy", "bash-completion").stdout
        engine = chroot.run("apt-cache", "policy", "docker.io").stdout
        candidate = engine.split("Candidate: ")[1].split()[0]
        # apt 2.6 prints the package's pin beside the version, the suite's beside its source
        assert re.search(rf"{re.escape(candidate)} 500\n\s+1 \S+ trixie(-security)?/main", engine), engine
        again = chroot.setup_host()  # the pin is this version's now: left as it is
        assert "lowered" not in again.stdout + again.stderr
    finally:
        chroot.run("dpkg", "--purge", "bash-completion")


def test_a_host_upgraded_to_debian_13_loses_the_pin(chroot):
    """The pin names trixie: on a host that is Debian 13 now it would hold back the host's own suite
    (every trixie version at 1). The script removes its two files there, and says so."""
    sources, pin = chroot.root / SOURCES, chroot.root / PIN
    release = chroot.root / "etc" / "os-release"
    was = {path: path.read_bytes() if path.exists() else None for path in (sources, pin)}
    os_release = release.read_text()
    release.unlink()  # a link to usr/lib/os-release: replaced by a file for the test, restored after
    release.write_text(os_release.replace("VERSION_CODENAME=bookworm", "VERSION_CODENAME=trixie"))
    sources.write_text(OLD_SOURCES)
    pin.write_text(OLD_PIN)
    try:
        proc = chroot.setup_host()
        assert not sources.exists() and not pin.exists(), proc.stderr
        assert ("setup-host: removed /etc/apt/preferences.d/ml-image-builder-trixie and "
                "/etc/apt/sources.list.d/ml-image-builder-trixie.sources: they were for Debian 12, and this host "
                "is trixie now") in proc.stderr
    finally:
        release.unlink()
        release.symlink_to("../usr/lib/os-release")
        for path, data in was.items():
            if data is not None:
                path.write_bytes(data)


def test_only_the_services_of_packages_it_installs_now_are_masked(chroot):
    """A compute node: slurmd installed (its unit there), slurm-wlm absent. The script installs slurm-wlm,
    which brings slurmctld: slurmctld alone is masked, with the line that undoes it; slurmd stays as
    it was. Then slurmd's unit is one of the admin's (no package): the install brings Debian's slurmd,
    and its service is not masked either. systemctl is a stand-in (the module's docstring)."""
    log = chroot.root / "var/lib/standin-systemctl.log"
    systemctl = chroot.root / "usr/local/bin/systemctl"
    systemd = chroot.root / "run/systemd/system"
    admins_unit = chroot.root / "etc/systemd/system/slurmd.service"
    chroot.run("dpkg", "--purge", "slurm-wlm")
    systemctl.write_text(SYSTEMCTL)
    systemctl.chmod(0o755)
    systemd.mkdir(parents=True)
    try:
        chroot.run("dpkg", "-i", "/srv/standin/slurmd_standin_all.deb")  # the compute node's
        proc = chroot.setup_host()
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        assert chroot.installed("slurm-wlm") and chroot.installed("slurmctld"), out
        calls = log.read_text().splitlines()
        masked = [call for call in calls if call.startswith("mask")]
        assert masked == ["mask --quiet slurmctld.service"], calls
        assert ("setup-host: masked slurmctld, installed now (the tests start them themselves); "
                "undo: systemctl unmask slurmctld.service") in out

        chroot.run("dpkg", "--purge", "slurm-wlm", "slurmctld", "slurmd")
        admins_unit.parent.mkdir(parents=True, exist_ok=True)
        admins_unit.write_text(UNIT)
        log.unlink(missing_ok=True)
        proc = chroot.setup_host()
        assert chroot.installed("slurmd"), proc.stderr
        masked = [call for call in log.read_text().splitlines() if call.startswith("mask")]
        assert masked == ["mask --quiet slurmctld.service"], proc.stderr
    finally:
        chroot.run("dpkg", "--purge", "slurm-wlm", "slurmctld", "slurmd", check=False)
        chroot.dpkg_i("slurm-wlm")
        for path in (systemctl, log, admins_unit):
            path.unlink(missing_ok=True)
        shutil.rmtree(chroot.root / "run/systemd", ignore_errors=True)


@contextmanager
def debian_engine(chroot: Chroot, version: str) -> Iterator[Path]:
    """Debian's engine (docker.io, containerd, docker-buildx) in place of Docker CE's stand-ins, its
    ``docker`` answering as Docker *version*; yields daemon.json (none at the start). Docker CE's
    stand-ins are back after, daemon.json and its kept copies gone."""
    daemon = chroot.root / "etc" / "docker" / "daemon.json"
    chroot.run("dpkg", "--purge", "docker-ce", "containerd.io")
    chroot.dpkg_i("docker.io", "containerd", "docker-buildx")
    (chroot.root / "etc" / "standin-docker-version").write_text(f"{version}\n")
    daemon.unlink(missing_ok=True)
    try:
        yield daemon
    finally:
        chroot.run("dpkg", "--purge", "docker.io", "containerd", "docker-buildx")
        chroot.dpkg_i("containerd.io", "docker-ce")
        (chroot.root / "etc" / "standin-docker-version").unlink()
        for path in daemon.parent.glob("*daemon.json*"):
            path.unlink()


def kept(daemon: Path) -> list[Path]:
    """The copies of daemon.json the script kept beside it."""
    return sorted(daemon.parent.glob("daemon.json.ml-image-builder-*.bak"))


def test_debians_engine_gets_its_daemon_json_replaced_whole_and_the_old_one_kept(chroot):
    """Debian's docker.io 26.1 (the engine this script installs) reads CDI specs only with
    ``"features": {"cdi": true}``. The script merges it into the daemon.json there (every other key
    kept) by writing a new file and renaming it over the old (a new inode: never a truncated file),
    keeps the old one beside it and names it. The file an earlier version wrote (byte for byte) gets
    BuildKit's cache bound in the same edit. A ``"cdi"`` the file sets stays; a file that is not JSON
    is left as it is, with one line; where there is none, one is made. Nothing is edited twice."""
    with debian_engine(chroot, "26.1.5") as daemon:
        daemon.parent.mkdir(parents=True, exist_ok=True)
        ours_before = '{\n  "features": {"containerd-snapshotter": true}\n}\n'
        daemon.write_text(ours_before)
        inode = daemon.stat().st_ino
        proc = chroot.setup_host()
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        assert json.loads(daemon.read_text()) == {
            "features": {"containerd-snapshotter": True, "cdi": True},
            "builder": {"gc": {"enabled": True, "defaultKeepStorage": "30GB"}}}, out
        assert daemon.stat().st_ino != inode and (daemon.stat().st_mode & 0o777) == 0o644
        [backup] = kept(daemon)
        assert backup.read_text() == ours_before and backup.stat().st_ino == inode
        assert "setup-host: added BuildKit's 30GB bound to /etc/docker/daemon.json" in out
        assert ("setup-host: turned on Docker's CDI (\"features\": {\"cdi\": true}) in /etc/docker/daemon.json: "
                "CDI device names work from dockerd's next start") in out
        name = f"/etc/docker/{backup.name}"
        assert f"the file before is kept as {name} (undo: mv {name} /etc/docker/daemon.json, then restart" in out
        assert sorted(p.name for p in daemon.parent.iterdir()) == sorted(["daemon.json", backup.name])  # no temp file
        merged = daemon.read_text()
        again = chroot.setup_host()
        assert daemon.read_text() == merged and "CDI" not in again.stderr and kept(daemon) == [backup], again.stderr
        backup.unlink()

        users = '{"features": {"containerd-snapshotter": true}, "log-level": "warn"}\n'
        daemon.write_text(users)
        out = chroot.setup_host().stderr
        assert json.loads(daemon.read_text()) == {"features": {"containerd-snapshotter": True, "cdi": True},
                                                  "log-level": "warn"}, out
        [backup] = kept(daemon)
        assert backup.read_text() == users and "BuildKit's cache is unbounded here: add" in out
        backup.unlink()

        daemon.write_text('{"features": {"cdi": false}}\n')
        chroot.setup_host()
        assert daemon.read_text() == '{"features": {"cdi": false}}\n' and not kept(daemon)

        daemon.write_text("{not json\n")
        out = chroot.setup_host().stderr
        assert daemon.read_text() == "{not json\n" and not kept(daemon)
        lines = [line for line in out.splitlines() if "daemon.json" in line]
        assert len(lines) == 1 and lines[0].startswith("setup-host: /etc/docker/daemon.json is not valid JSON ("), out
        assert lines[0].endswith("fix it (dockerd does not start with it), then run /tmp/setup-host.sh again; "
                                 "it was not changed"), out

        daemon.unlink()
        chroot.setup_host()
        assert json.loads(daemon.read_text()) == {"features": {"cdi": True}} and not kept(daemon)


def test_docker_ces_daemon_json_is_never_edited_and_the_line_to_add_is_printed(chroot):
    """Docker CE 26.1 (the fixture's stand-ins, an engine this script did not install): its daemon.json
    is left byte for byte (the same inode, nothing beside it), the file an earlier version wrote
    included, and none is made where there is none; the line to add is printed."""
    daemon = chroot.root / "etc" / "docker" / "daemon.json"
    daemon.parent.mkdir(parents=True, exist_ok=True)
    version = chroot.root / "etc" / "standin-docker-version"
    version.write_text("26.1.5\n")
    line = ("setup-host: Docker 26.1.5 reads CDI specs only with \"features\": {\"cdi\": true} in "
            "/etc/docker/daemon.json: add it (setup-host edits only the daemon.json of Debian's docker.io), "
            "then restart dockerd")
    try:
        for text in ('{"features": {"containerd-snapshotter": true}, "log-level": "warn"}\n',
                     '{\n  "features": {"containerd-snapshotter": true}\n}\n'):
            daemon.write_text(text)
            inode = daemon.stat().st_ino
            proc = chroot.setup_host()
            assert proc.returncode == 0, proc.stderr
            assert daemon.read_text() == text and daemon.stat().st_ino == inode, proc.stderr
            assert os.listdir(daemon.parent) == ["daemon.json"]
            assert line in proc.stderr and "BuildKit's cache is unbounded here: add" in proc.stderr
        daemon.unlink()
        proc = chroot.setup_host()
        assert not daemon.exists() and line in proc.stderr
    finally:
        version.unlink()
        daemon.unlink(missing_ok=True)
