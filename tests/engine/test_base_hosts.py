"""The base is the same bytes whichever host bootstraps it (issue 43).

Two bootstraps of the project's spec from the same mirror: one by the builder on this host, one in a
Debian 13 root of its own (its mmdebstrap 1.5.7 and tar 1.35, which write POSIX headers where Debian
12's write GNU ones), with what another host has: its own ``/etc/hostname`` and ``/etc/resolv.conf``
(other contents, another mode), umask 077, and a caller whose locale (de_DE.UTF-8, generated there),
time zone, ``PATH``, ``TMPDIR``, ``PYTHONDONTWRITEBYTECODE=1`` and ``SOURCE_DATE_EPOCH`` differ. The
root runs exactly the command and environment the builder gives (:func:`mmdebstrap_argv`,
:func:`mmdebstrap_env` under that caller), then :func:`canonical_tar`. Needs root, mmdebstrap,
unshare and the mirror; no engine (marked ``engine`` all the same: it bootstraps twice, so it runs
in the main pass, never in the unit pass). Debian 13's raw tarball is other bytes than this host's
canonical one (its tar writes headers of its own), so without :func:`canonical_tar` it fails too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from builder.base.bootstrap import (
    _packages,
    bootstrap,
    canonical_tar,
    mirror_login,
    mmdebstrap_argv,
    mmdebstrap_env,
)
from builder.config.matrix import Bootstrap
from builder.config.project import load_project
from builder.config.urls import public
from builder.oci.secrets import MMDEBSTRAP, child_env
from devtools.support import REPO, fail_or_skip, host_platform

pytestmark = [pytest.mark.engine, pytest.mark.heavy, pytest.mark.slow]

#: The caller on the other host: each would change the base if it reached a maintainer script or tool.
OTHER_CALLER = {"LANG": "de_DE.UTF-8", "LC_ALL": "de_DE.UTF-8", "TZ": "JST-9", "TMPDIR": "/var/tmp",
                "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "SOURCE_DATE_EPOCH": "1"}
#: In a mount namespace of its own: the kernel's file systems mounted for mmdebstrap's root mode, then
#: the command in the root, under the other host's umask.
IN_ROOT = ('set -e; root=$1; shift; mount -t proc proc "$root/proc"; mount --rbind /dev "$root/dev"; '
           'mount --rbind /sys "$root/sys"; umask 077; exec chroot "$root" "$@"')


def _spec() -> Bootstrap:
    spec = load_project(REPO / "matrix.yaml").matrix.base.bootstrap
    assert spec is not None, "matrix.yaml's base is bootstrapped"
    return spec


def _needs() -> None:
    if mirror_login(_spec().mirror) is not None:
        pytest.skip("the second root bootstraps from the mirror without its login")
    if os.geteuid() != 0:
        fail_or_skip("bootstrapping in a second root needs root (mount, chroot)")
    for tool in ("mmdebstrap", "unshare", "chroot"):
        if shutil.which(tool) is None:
            fail_or_skip(f"{tool} is not installed (apt-get install mmdebstrap util-linux coreutils)")


def _run(argv: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(argv, check=False, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert done.returncode == 0, f"{argv[:6]} failed:\n" + done.stdout[-3000:]


@pytest.fixture(scope="session")
def debian13(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Debian 13 (trixie) root with its mmdebstrap, looking like another host."""
    _needs()
    root = tmp_path_factory.mktemp("debian13") / "root"
    _run(["mmdebstrap", "--variant=apt", "--include=mmdebstrap,mount,locales", "trixie", str(root),
          public(_spec().mirror)], child_env(MMDEBSTRAP))
    (root / "etc/hostname").write_text("another-host\n")
    resolver = root / "etc/resolv.conf"  # this host's, for the network; another text and mode
    resolver.write_text("# another host's resolver\n" + resolver.read_text())
    for name in ("etc/hostname", "etc/resolv.conf"):  # another mode, readable still (apt resolves as _apt)
        mine = Path("/", name).stat().st_mode & 0o7777 if Path("/", name).exists() else None
        (root / name).chmod(0o664 if mine == 0o644 else 0o644)
    _run(["chroot", str(root), "localedef", "-i", "de_DE", "-f", "UTF-8", "de_DE.UTF-8"], child_env(MMDEBSTRAP))
    return root


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def _first_difference(a: Path, b: Path) -> str:
    """The first member of two tarballs that differs, and in what: what of the host reached the base."""
    with tarfile.open(a) as ta, tarfile.open(b) as tb:
        for ma, mb in zip(ta, tb, strict=False):
            if ma.name != mb.name:
                return f"member order: {ma.name} here, {mb.name} there"
            for what, va, vb in (("type", ma.type.decode(), mb.type.decode()), ("mode", oct(ma.mode), oct(mb.mode)),
                                 ("owner", (ma.uid, ma.gid), (mb.uid, mb.gid)), ("mtime", ma.mtime, mb.mtime),
                                 ("link", ma.linkname, mb.linkname), ("pax records", ma.pax_headers, mb.pax_headers),
                                 ("size", ma.size, mb.size)):
                if va != vb:
                    return f"{ma.name}: {what} {va} here, {vb} there"
            if ma.isreg() and ta.extractfile(ma).read() != tb.extractfile(mb).read():  # type: ignore[union-attr]
                return f"{ma.name}: content"
        na, nb = len(ta.getmembers()), len(tb.getmembers())
    return f"member count: {na} here, {nb} there" if na != nb else "no member differs (the bytes do)"


def test_the_base_is_the_same_bytes_bootstrapped_on_another_host(tmp_path: Path, debian13: Path) -> None:
    """Fails where anything of the host reaches the base (mmdebstrap's copies of /etc/hostname and
    /etc/resolv.conf would, were they not emptied); the failure names the first member that differs."""
    spec, platform = _spec(), host_platform()
    here = bootstrap(spec, tmp_path, platform)
    with pytest.MonkeyPatch.context() as caller:  # the builder's environment for mmdebstrap on the other host
        for name, value in OTHER_CALLER.items():
            caller.setenv(name, value)
        env = mmdebstrap_env(spec)
    raw, there = debian13 / "mmdebstrap.tar", tmp_path / "there.tar"
    try:
        _run(["unshare", "--mount", "--fork", "sh", "-c", IN_ROOT, "sh", str(debian13),
              *mmdebstrap_argv(spec, Path("/mmdebstrap.tar"), platform)], env)
        assert _digest(raw) != here.diff_id, "Debian 13's mmdebstrap wrote the canonical bytes: canonical_tar untested"
        canonical_tar(raw, there)
    finally:
        raw.unlink(missing_ok=True)
    if _packages(there) != here.packages:
        pytest.skip("the mirror moved between the two bootstraps")
    assert _digest(there) == here.diff_id, ("the host reached the base (here: this host, there: the Debian 13 root): "
                                            + _first_difference(here.tarball, there))
    here.tarball.unlink()  # ~200 MB each; kept where the test fails
    there.unlink()
