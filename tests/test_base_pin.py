"""The one way to the base (:func:`builder.base.pin.get`): what each need takes as it is, and when it
settles the base; whether a base is local is asked one way (:func:`builder.base.pin.local`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from doubles import NoEngine

from builder.base import pin
from builder.config.baselock import PinnedBase, read_base_lock
from builder.config.errors import UserError
from builder.config.project import load_project

PLATFORM = "linux/amd64"


def _settled(calls: list[str]) -> object:
    def settle(engine: object, project: object, platform: str, **how: object) -> PinnedBase:
        calls.append(platform)
        return PinnedBase(reference="localhost:5000/ml-runtime/base@sha256:" + "1" * 64, image_id="sha256:" + "2" * 64)
    return settle


def test_get_takes_the_base_as_it_is_where_the_need_is_met(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = load_project(project / "matrix.yaml")
    pinned = read_base_lock(p.root).platforms[PLATFORM].reference  # type: ignore[union-attr]
    calls: list[str] = []
    monkeypatch.setattr(pin, "_settle", _settled(calls))
    monkeypatch.setattr(pin, "local", lambda engine, ref: ref == pinned)
    monkeypatch.setattr(pin, "_in_registry", lambda ref: pytest.fail("a local base is not looked up in the registry"))
    said: list[str] = []
    for need in ("pinned", "local"):
        assert pin.get(NoEngine(), p, PLATFORM, need=need, update=False, say=said.append) == pinned
    assert calls == [] and said == []
    pin.get(NoEngine(), p, PLATFORM, need="published", update=False, say=said.append)  # always settled
    assert calls == [PLATFORM]


def test_get_settles_a_base_that_is_not_where_the_need_asks(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = load_project(project / "matrix.yaml")
    calls: list[str] = []
    monkeypatch.setattr(pin, "_settle", _settled(calls))
    monkeypatch.setattr(pin, "local", lambda engine, ref: False)
    monkeypatch.setattr(pin, "_in_registry", lambda ref: True)
    said: list[str] = []
    # Pinned: in the registry is enough (a build pulls it when a view builds).
    assert pin.get(NoEngine(), p, PLATFORM, need="pinned", update=False, say=said.append) == p.base_for(PLATFORM)
    assert calls == []
    # Local: fetched, and said.
    got = pin.get(NoEngine(), p, PLATFORM, need="local", update=False, say=said.append)
    assert calls == [PLATFORM] and got.endswith("1" * 64)
    assert said == [f"base {p.base_for(PLATFORM)} ({PLATFORM}) is not local: fetching it"]
    # Pinned, in neither: settled (bootstrapped and pinned there, with --update-base where the mirror moved).
    monkeypatch.setattr(pin, "_in_registry", lambda ref: False)
    pin.get(NoEngine(), p, PLATFORM, need="pinned", update=False, say=said.append)
    assert calls == [PLATFORM, PLATFORM]


def test_get_pinned_refuses_a_lock_without_the_platform_unless_it_may_update(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = load_project(project / "matrix.yaml")
    (project / "base.lock.json").unlink()
    calls: list[str] = []
    monkeypatch.setattr(pin, "_settle", _settled(calls))
    with pytest.raises(UserError, match="builder base --platform"):
        pin.get(NoEngine(), p, PLATFORM, need="pinned", update=False, say=print)
    assert calls == []
    pin.get(NoEngine(), p, PLATFORM, need="pinned", update=True, say=print)
    assert calls == [PLATFORM]


def test_the_base_tarball_is_the_same_bytes_whichever_tar_wrote_it(tmp_path):
    """Debian 12's mmdebstrap (1.3.5, GNU tar 1.34) writes GNU headers, Debian 13's (1.5.7, tar 1.35)
    POSIX ones: from the same mirror state both gave the same files (names, modes, owners, times,
    contents) and other bytes, so every host re-pinned. Here host GNU tar writes one tree (long names,
    a hard link, a symlink, an empty folder, an extended attribute where the file system takes one) in
    both formats: the canonical tarballs are one, and hold every member as it was."""
    import contextlib
    import os
    import subprocess
    import tarfile

    from builder.base.bootstrap import canonical_tar

    root = tmp_path / "root"
    deep = root / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    (deep / ("f" * 80)).write_bytes(b"long name\n")
    (root / "file").write_bytes(b"x" * 5000)
    (root / "link").symlink_to("file")
    (root / "hard").hardlink_to(root / "file")
    (root / "empty").mkdir()
    (root / "tool").write_bytes(b"#!/bin/sh\n")
    (root / "tool").chmod(0o4755)
    xattr = False
    with contextlib.suppress(OSError):  # a file system without user xattrs (tmpfs before Linux 6.6)
        os.setxattr(root / "tool", "user.builder", b"1")
        xattr = True
    out = {}
    for fmt in ("gnu", "pax", "posix"):
        raw = tmp_path / f"{fmt}.tar"
        subprocess.run(["tar", f"--format={fmt}", "--xattrs", "--sort=name", "--mtime=@1735689600", "--clamp-mtime",
                        "--owner=0", "--group=0", "--numeric-owner", "-cf", str(raw), "-C", str(root), "."], check=True)
        canonical_tar(raw, tmp_path / f"{fmt}.canonical.tar")
        out[fmt] = (tmp_path / f"{fmt}.canonical.tar").read_bytes()
    assert len({(tmp_path / f"{f}.tar").read_bytes() for f in out}) > 1, "GNU tar wrote the formats alike"
    assert out["gnu"] == out["pax"] == out["posix"]

    def members(path):
        with tarfile.open(path) as tar:
            return [(m.name, m.type, m.mode, m.uid, m.gid, int(m.mtime), m.linkname, m.size,
                     tar.extractfile(m).read() if m.isreg() else None) for m in tar]  # type: ignore[union-attr]
    assert members(tmp_path / "gnu.canonical.tar") == members(tmp_path / "gnu.tar")
    if xattr:
        with tarfile.open(tmp_path / "gnu.canonical.tar") as tar:
            assert tar.getmember("./tool").pax_headers == {"SCHILY.xattr.user.builder": "1"}


def test_mmdebstrap_runs_in_an_environment_of_ours_whatever_the_caller_has(project: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """What another host's shell holds reaches no maintainer script: PYTHONDONTWRITEBYTECODE=1 made
    py3compile write hash-based .pyc files for debpython (flags 3, timestamp ones without it); the locale,
    the time zone and an epoch of the caller's are replaced by ours."""
    from builder.base.bootstrap import mmdebstrap_env

    spec = load_project(project / "matrix.yaml").matrix.base.bootstrap
    assert spec is not None
    for name, value in {"LANG": "de_DE.UTF-8", "LC_ALL": "de_DE.UTF-8", "LC_TIME": "de_DE.UTF-8", "TZ": "JST-9",
                        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "1", "SOURCE_DATE_EPOCH": "1"}.items():
        monkeypatch.setenv(name, value)
    env = mmdebstrap_env(spec)
    assert not [name for name in env if name.startswith("PYTHON")]
    assert (env["LC_ALL"], env["LANG"], env["TZ"]) == ("C.UTF-8", "C.UTF-8", "UTC")
    assert env["SOURCE_DATE_EPOCH"] == str(spec.source_date_epoch)


def test_the_hosts_name_and_resolver_leave_the_base_empty(project: Path, tmp_path: Path) -> None:
    """mmdebstrap copies the host's /etc/hostname and /etc/resolv.conf in (contents and mode): the
    builder's customize hook leaves both empty, mode 0644, whether the host had them or not, and
    puts an empty /etc/hosts beside them (a mount point every RUN step needs: see HOST_FILES_HOOK)."""
    import subprocess

    from builder.base.bootstrap import mmdebstrap_argv

    spec = load_project(project / "matrix.yaml").matrix.base.bootstrap
    assert spec is not None
    hooks = [a.split("=", 1)[1] for a in mmdebstrap_argv(spec, tmp_path / "out.tar", PLATFORM)
             if a.startswith("--customize-hook=") and "hostname" in a]
    assert len(hooks) == 1
    for copied in (True, False):
        root = tmp_path / f"root-{copied}"
        (root / "etc").mkdir(parents=True)
        if copied:
            for name in ("hostname", "resolv.conf"):
                (root / "etc" / name).write_text("vm\n")
                (root / "etc" / name).chmod(0o755)
        subprocess.run(["sh", "-c", hooks[0], "sh", str(root)], check=True)
        for name in ("hostname", "hosts", "resolv.conf"):
            made = root / "etc" / name
            assert (made.read_bytes(), made.stat().st_mode & 0o7777) == (b"", 0o644), (copied, name)


def test_the_base_leaves_shadows_lock_file_out(project: Path, tmp_path: Path) -> None:
    """The maintainer scripts' useradd leaves /etc/.pwd.lock; a RUN step's useradd would copy it up
    unchanged, which the classic store alone keeps in the step's layer (see LOCK_FILES_HOOK). The
    customize hooks, run as mmdebstrap runs them, remove it and nothing else of /etc."""
    import subprocess

    from builder.base.bootstrap import mmdebstrap_argv

    spec = load_project(project / "matrix.yaml").matrix.base.bootstrap
    assert spec is not None
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / ".pwd.lock").write_bytes(b"")
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    for arg in mmdebstrap_argv(spec, tmp_path / "out.tar", PLATFORM):
        if arg.startswith("--customize-hook="):
            subprocess.run(["sh", "-c", arg.split("=", 1)[1], "sh", str(root)], check=True)
    assert sorted(p.name for p in (root / "etc").iterdir()) == ["hostname", "hosts", "passwd", "resolv.conf"]


def test_mmdebstrap_runs_with_umask_022_whatever_the_callers() -> None:
    import os

    from builder.base.bootstrap import _run_mmdebstrap

    old = os.umask(0o077)
    try:
        code, out = _run_mmdebstrap(["sh", "-c", "umask"], {"PATH": os.environ["PATH"]}, PLATFORM, heartbeat_s=60)
    finally:
        os.umask(old)
    assert (code, out.strip()) == (0, "0022")


def test_the_recipe_hash_follows_the_bootstrap_hooks(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pin records how it was bootstrapped; another hook (an upgrade of the builder) gives another
    recipe, which the drift message names instead of calling the difference a bug."""
    from builder.base import bootstrap

    spec = load_project(project / "matrix.yaml").matrix.base.bootstrap
    assert spec is not None
    before = bootstrap.recipe_hash(spec)
    assert bootstrap.recipe_hash(spec) == before
    monkeypatch.setattr(bootstrap, "HOST_FILES_HOOK", "true")
    assert bootstrap.recipe_hash(spec) != before
