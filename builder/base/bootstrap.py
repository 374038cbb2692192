"""Making the base from Debian: mmdebstrap writes a root file system tarball, and we write its image.

With a fixed SOURCE_DATE_EPOCH the same packages give the same files, whatever the host: mmdebstrap
runs with an environment of ours (:func:`mmdebstrap_env`) and a fixed umask, and the host's
``/etc/hostname`` and ``/etc/resolv.conf``, which it copies in for apt, are left empty. The tarball
is then written again in one format of our own (:func:`canonical_tar`), because mmdebstrap's own depends on the
host's mmdebstrap and GNU tar (Debian 12's writes GNU headers, Debian 13's POSIX ones: the same
files, other bytes, another pin on every host that differs). We then write the
docker-archive ourselves, with a config whose ``created`` time is that epoch, so the image ID (the
config's digest) is reproducible too (``docker import`` would stamp the current time). Nothing here
needs an engine or a registry (:mod:`builder.base.blobs` moves the bytes, :mod:`builder.base.pin` pins them).
"""

from __future__ import annotations

import hashlib
import io
import json
import shlex
import shutil
import subprocess
import tarfile
import time
import urllib.parse
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from builder.config import platforms
from builder.config.errors import UserError
from builder.config.heartbeat import HEARTBEAT_S, heartbeat
from builder.config.matrix import Bootstrap
from builder.config.urls import public
from builder.oci.secrets import MMDEBSTRAP, child_env


@dataclass(frozen=True)
class Rootfs:
    """A bootstrapped root file system tarball and what is inside."""

    tarball: Path
    diff_id: str
    packages: dict[str, str]


#: Where apt inside the bootstrap reads the mirror's login (apt_auth.conf(5)): put there by a setup hook
#: from the builder's private folder, removed by a customize hook before the root file system is packed.
AUTH_IN_ROOT = "etc/apt/auth.conf.d/90-builder-mirror.conf"


def mirror_login(mirror: str) -> str | None:
    """apt_auth.conf(5)'s entry for the login in *mirror* (``http://user:password@host/debian``); None without one.

    The mirror goes to mmdebstrap, and so into the base's apt sources, without it (:func:`public`).

    Example:
        >>> mirror_login("http://ci:t%40k@mirror.example:8080/debian")
        'machine http://mirror.example:8080/debian login ci password t@k\\n'
        >>> mirror_login("http://deb.debian.org/debian") is None
        True
    """
    parts = urllib.parse.urlsplit(mirror)
    if parts.username is None:
        return None
    login, password = urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or "")
    if any(c.isspace() for c in login + password):
        raise UserError(f"base.bootstrap.mirror {public(mirror)}: its login holds white space, which apt's auth.conf "
                        "cannot carry; use a login without it")
    netloc = parts.netloc.rpartition("@")[2]
    return f"machine {parts.scheme}://{netloc}{parts.path} login {login} password {password}\n"


#: The files an engine mounts into every container and every RUN step, each an empty file of mode
#: 0644. mmdebstrap copies the host's name and resolver in for apt (contents and mode: another host,
#: another base). /etc/hosts it leaves out, and where a mount point is absent BuildKit creates a
#: stub for it in each RUN; on Docker's classic store the stub's removal left /etc, with the build's
#: time, in every RUN's layer (no layer reproducible, an empty step a non-empty layer).
HOST_FILES_HOOK = ('for f in hostname hosts resolv.conf; do rm -f "$1/etc/$f" && : > "$1/etc/$f" && '
                   'chmod 0644 "$1/etc/$f"; done')

#: shadow's lock file, left by the maintainer scripts' useradd. A RUN step's useradd opens it for
#: writing, so the overlay copies it up unchanged: Docker's classic store keeps such a copy in the
#: step's layer and the containerd store does not, and the two stores would give other layers.
#: Absent from the base, a step's useradd creates it anew and the step removes it (templates/).
LOCK_FILES_HOOK = 'rm -f "$1/etc/.pwd.lock"'


def mmdebstrap_env(spec: Bootstrap) -> dict[str, str]:
    """The environment mmdebstrap runs in: its variables of ours (:data:`MMDEBSTRAP`: never a ``PYTHON*``
    one, which would reach the maintainer scripts' byte-compiling), the spec's epoch, and the locale and
    time zone fixed, whatever the caller's.

    Example:
        >>> env = mmdebstrap_env(project.matrix.base.bootstrap)
        >>> env["SOURCE_DATE_EPOCH"], env["LC_ALL"], env["TZ"]
        ('1735689600', 'C.UTF-8', 'UTC')
    """
    return child_env(MMDEBSTRAP, {"SOURCE_DATE_EPOCH": str(spec.source_date_epoch), "LANG": "C.UTF-8",
                                  "LANGUAGE": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC"})


def mmdebstrap_argv(spec: Bootstrap, output: Path, platform: str, auth: Path | None = None) -> list[str]:
    """The mmdebstrap command for a spec and platform (docs and man pages left out, copyright files kept).

    A foreign architecture's maintainer scripts run under qemu (binfmt_misc), as in its containers.
    The mirror is named without its login; *auth*, the file holding it (:func:`mirror_login`), is
    apt's for the bootstrap alone.

    Example:
        >>> spec = project.matrix.base.bootstrap
        >>> mmdebstrap_argv(spec, Path("/tmp/rootfs.tar"), "linux/arm64")[:4]
        ['mmdebstrap', '--variant=minbase', '--arch=arm64', '--format=tar']
    """
    put = f'mkdir -p "$1/etc/apt/auth.conf.d" && install -m 0600 {shlex.quote(str(auth))} "$1/{AUTH_IN_ROOT}"'
    hooks = [f"--setup-hook={put}", f'--customize-hook=rm "$1/{AUTH_IN_ROOT}"'] if auth else []
    hooks += [f"--customize-hook={HOST_FILES_HOOK}", f"--customize-hook={LOCK_FILES_HOOK}"]
    return [
        "mmdebstrap",
        f"--variant={spec.variant}",
        f"--arch={platforms.arch(platform)}",
        "--format=tar",
        f"--include={','.join(spec.packages)}",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        "--dpkgopt=path-exclude=/usr/share/info/*",
        "--verbose",  # dpkg's lines: the heartbeat counts the packages
        *hooks,
        spec.suite,
        str(output),
        public(spec.mirror),
    ]


def bootstrap(spec: Bootstrap, workdir: Path, platform: str) -> Rootfs:
    """Run mmdebstrap into *workdir*; return the tarball, its digest and its package list."""
    if shutil.which("mmdebstrap") is None:
        raise UserError("mmdebstrap is not installed: apt-get install mmdebstrap (it makes the base)")
    if (problem := platforms.emulation_problem(platform)) is not None:
        raise UserError(f"bootstrapping the base: {problem}")
    raw, output = workdir / "mmdebstrap.tar", workdir / "rootfs.tar"
    env = mmdebstrap_env(spec)
    auth = None
    if (login := mirror_login(spec.mirror)) is not None:
        auth = workdir / "mirror-auth.conf"
        auth.touch(mode=0o600)
        auth.write_text(login)
    try:
        code, stderr = _run_mmdebstrap(mmdebstrap_argv(spec, raw, platform, auth), env, platform)
    finally:
        if auth is not None:
            auth.unlink()
    if code != 0:
        tail = " | ".join(stderr.strip().splitlines()[-3:])
        raise UserError(f"mmdebstrap failed for suite {spec.suite} ({platform}) from {public(spec.mirror)}: {tail}")
    try:
        canonical_tar(raw, output)
    finally:
        raw.unlink()
    digest = hashlib.sha256()
    with output.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return Rootfs(output, f"sha256:{digest.hexdigest()}", _packages(output))


#: The pax records a canonical tarball keeps: the file's extended attributes (a capability, say);
#: never atime or ctime, which differ between runs, nor a writer's own records.
_KEPT_PAX = "SCHILY.xattr."


def canonical_tar(source: Path, target: Path) -> None:
    """*source*'s members, in its order, written to *target* as POSIX (pax) tar by Python's tarfile: the
    bytes depend on the files alone (names, types, modes, owners by number, whole-second times, links,
    devices, extended attributes, contents), never on the tool or format that wrote *source*.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> for fmt in ("gnu", "pax"):
        ...     _ = subprocess.run(["tar", f"--format={fmt}", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner",
        ...                         "-cf", str(d / f"{fmt}.tar"), "-C", "/etc", "hostname"], check=True)
        ...     canonical_tar(d / f"{fmt}.tar", d / f"{fmt}.canonical.tar")
        >>> (d / "gnu.tar").read_bytes() == (d / "pax.tar").read_bytes()
        False
        >>> (d / "gnu.canonical.tar").read_bytes() == (d / "pax.canonical.tar").read_bytes()
        True
        >>> shutil.rmtree(d)
    """
    with tarfile.open(source) as src, tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as out:
        for member in src:
            info = tarfile.TarInfo(member.name)
            info.type, info.mode, info.uid, info.gid = member.type, member.mode, member.uid, member.gid
            info.uname = info.gname = ""  # owners by number (mmdebstrap's --numeric-owner)
            info.mtime = int(member.mtime)
            info.linkname, info.devmajor, info.devminor = member.linkname, member.devmajor, member.devminor
            info.pax_headers = {k: v for k, v in sorted(member.pax_headers.items()) if k.startswith(_KEPT_PAX)}
            if member.isreg():
                info.size = member.size
                out.addfile(info, src.extractfile(member))
            else:
                out.addfile(info)


def _run_mmdebstrap(argv: list[str], env: dict[str, str], platform: str,
                    heartbeat_s: float = HEARTBEAT_S) -> tuple[int, str]:
    """Run mmdebstrap, saying what it does every *heartbeat_s* seconds (minutes under qemu, silent
    otherwise); return its exit code and output. ``--verbose`` prints dpkg's lines, which count the packages."""
    started, lines, unpacked = time.monotonic(), [], [0]
    stage = ["starting"]

    def status() -> str:
        return (f"bootstrapping {platform}: {unpacked[0]} packages unpacked, {stage[0]} "
                f"({time.monotonic() - started:.0f} s)")

    # umask: mmdebstrap (1.3.5, 1.5.7) sets 022 itself; the base leans on no version's habit
    with heartbeat(status, heartbeat_s), subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, umask=0o022,
                                                         stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Unpacking "):
                unpacked[0] += 1
            elif line.startswith("I: "):
                stage[0] = line[3:].strip().rstrip(".")
        code = proc.wait()
    return code, "".join(lines)


def _packages(tarball: Path) -> dict[str, str]:
    """Installed Debian packages and versions, read from the tarball's dpkg status."""
    with tarfile.open(tarball) as tar:
        member = tar.extractfile("./var/lib/dpkg/status")
        text = member.read().decode() if member else ""
    out = {}
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" "))
        if "Package" in fields and "installed" in fields.get("Status", ""):
            out[fields["Package"]] = fields.get("Version", "")
    return dict(sorted(out.items()))


def image_config(rootfs: Rootfs, spec: Bootstrap, platform: str) -> bytes:
    """The image config, serialised deterministically; its sha256 is the image ID."""
    created = datetime.fromtimestamp(spec.source_date_epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    config = {
        "architecture": platforms.arch(platform),
        "os": "linux",
        "created": created,
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"],
            "Cmd": ["/bin/bash"],
            "Labels": {"io.ml-image-builder.images.base": f"debian-{spec.suite}-{spec.variant}"},
        },
        "rootfs": {"type": "layers", "diff_ids": [rootfs.diff_id]},
        "history": [{"created": created, "created_by": f"mmdebstrap {spec.suite} ({', '.join(spec.packages)})"}],
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def write_archive(rootfs: Rootfs, config: bytes, repo_tag: str, archive: Path) -> str:
    """Write a docker-archive (``docker save`` layout) and return the image ID it loads as."""
    image_id = "sha256:" + hashlib.sha256(config).hexdigest()
    layer_dir = rootfs.diff_id.split(":", 1)[1]
    manifest = json.dumps([{"Config": f"{image_id[7:]}.json", "RepoTags": [repo_tag],
                            "Layers": [f"{layer_dir}/layer.tar"]}]).encode()
    with tarfile.open(archive, "w") as tar:
        for name, data in ((f"{image_id[7:]}.json", config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
        tar.add(rootfs.tarball, arcname=f"{layer_dir}/layer.tar")
    return image_id


def image_id_of(spec: Bootstrap, workdir: Path, platform: str) -> tuple[str, Rootfs]:
    """Bootstrap without an engine and compute the image ID it would load as."""
    rootfs = bootstrap(spec, workdir, platform)
    return "sha256:" + hashlib.sha256(image_config(rootfs, spec, platform)).hexdigest(), rootfs


#: Raised when the same files give the base other bytes: canonical_tar's format, image_config's fields.
TARBALL_FORMAT = 1


def recipe_hash(spec: Bootstrap) -> str:
    """Hash of how this builder bootstraps *spec*: mmdebstrap's arguments and hooks, and the tarball's
    format. Recorded with each pin, so that drift after a builder upgrade is told from a moved mirror."""
    argv = mmdebstrap_argv(spec, Path("rootfs.tar"), "linux/amd64")
    return hashlib.sha256(json.dumps([argv, TARBALL_FORMAT]).encode()).hexdigest()


def drift_report(old: dict[str, str], new: dict[str, str], recipe: bool | None) -> list[str]:
    """Why a fresh bootstrap differs from the locked base: the packages that moved, and whether the
    builder's recipe (:func:`recipe_hash`) is the lock's (*recipe*: True, False, or None when the lock
    does not say). Same recipe, no package moved, other bytes: a bug (the base must not depend on the host).

    Example:
        >>> drift_report({"tini": "0.19.0-1"}, {"tini": "0.19.0-1+b1"}, True)
        ['  the Debian mirror moved since the lock was written:', '  tini: 0.19.0-1 -> 0.19.0-1+b1']
        >>> drift_report({"tini": "0.19.0-1"}, {"tini": "0.19.0-1"}, False)[0][:63]
        '  this builder bootstraps otherwise than the one that wrote the'
        >>> drift_report({"tini": "0.19.0-1"}, {"tini": "0.19.0-1"}, True)[0][:60]
        '  no package moved, yet the bytes differ: a bug of the build'
    """
    moved = [f"  {name}: {old.get(name, '(absent)')} -> {new.get(name, '(absent)')}"
             for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)]
    if recipe is False:
        return [("  this builder bootstraps otherwise than the one that wrote the lock (its mmdebstrap arguments, "
                 "hooks or tarball format changed: expected after an upgrade of the builder)"),
                *(["  and the Debian mirror moved:", *moved] if moved else ["  no package moved"])]
    if moved:
        return ["  the Debian mirror moved since the lock was written:", *moved]
    if recipe is None:
        return [("  no package moved; the lock does not record the builder's recipe (written before it did), so "
                 "an upgrade of the builder may have changed the bytes")]
    return [("  no package moved, yet the bytes differ: a bug of the builder (the base must not depend on "
             "the host that made it); report it with both hosts' `mmdebstrap --version` and `tar --version`")]
