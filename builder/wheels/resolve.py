"""Resolving on the host for the image: uv resolves, pip downloads by hash; index probes.

uv resolves with the host's pip sources (index, extra indexes, find-links, CA bundle,
constraints; :func:`pip_sources`) behind the target's vendor index, with uv's ``first-index``
strategy: a name the vendor index has never comes from another source. pip downloads exactly
the resolved files by sha256, for the image's Python and every manylinux tag its glibc allows,
into the wheelhouse (:mod:`builder.wheels.wheelhouse`).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import requests
from packaging.utils import canonicalize_name
from uv import find_uv_bin

from builder.config import platforms
from builder.config.errors import TargetFailed, UserError
from builder.config.heartbeat import HEARTBEAT_S, heartbeat
from builder.config.ownership import clone_id
from builder.config.project import Project
from builder.config.urls import public, redact
from builder.oci.registry import cause, fetch
from builder.oci.secrets import PIP, UV, child_env
from builder.wheels import wheelhouse
from builder.wheels.lockfile import Pin, wheel_name_problem


def platform_args(project: Project, platform: str) -> list[str]:
    """pip options that resolve for the image's platform, not the host: every manylinux tag its glibc allows.

    pip matches platform tags exactly, and PyPI's CUDA torch pulls wheels tagged
    manylinux_2_17 ... manylinux_2_28, so all of them must be listed.

    Example:
        >>> platform_args(project, "linux/arm64")[5:7]
        ['--platform', 'manylinux_2_36_aarch64']
    """
    arch = platforms.machine(platform)
    major, minor = project.glibc
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1)]
    tags += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    args = ["--only-binary=:all:", "--python-version", project.matrix.python, "--implementation", "cp"]
    for tag in tags:
        args += ["--platform", tag]
    return args

def index_reachable(url: str, timeout: float = 8.0) -> str | None:
    """None if the index answers, else the reason it does not (one short phrase).

    A login in the URL (``https://user:token@mirror/simple``, as pip takes it) goes to the index
    alone: never across a redirect to another host, port or scheme (:func:`builder.oci.registry.fetch`).

    Example:
        >>> index_reachable("http://127.0.0.1:9/simple", timeout=2)
        'Connection refused'
    """
    if url.startswith("file://"):
        return None if Path(urllib.parse.urlparse(url).path).exists() else "no such folder"
    parts = urllib.parse.urlsplit(url.rstrip("/") + "/")
    login = None
    if parts.username is not None:
        secret = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        login = "Basic " + base64.b64encode(secret.encode()).decode()
        parts = parts._replace(netloc=parts.netloc.rpartition("@")[2])
    try:
        status = fetch("GET", parts.geturl(), login, timeout=timeout, ca=os.environ.get("PIP_CERT")).status_code
    except (requests.RequestException, OSError, ValueError) as exc:  # ValueError: a URL requests cannot parse
        return redact(cause(exc))[:120]
    return None if status < 500 else f"HTTP {status}"


def _pip(args: list[str], extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", "--retries", "1", "--timeout", "30", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, env=child_env(PIP, extra))

def _download(args: list[str], sizes: dict[str, int | None], heartbeat_s: float = HEARTBEAT_S,
              ) -> subprocess.CompletedProcess[str]:
    """``pip download`` of the wheels named in *sizes* (file name: bytes, where the index said),
    saying every *heartbeat_s* seconds how far it is. pip writes each wheel into a folder of its
    own under TMPDIR (here a private one) and saves them all at the end, so that folder tells."""
    with tempfile.TemporaryDirectory(prefix="builder-pip-") as tmp:
        def status() -> str:
            got = {f.name: f.stat().st_size for f in Path(tmp).rglob("*") if f.name in sizes and f.is_file()}
            known = [n for n in sizes.values() if n]
            total = f" of {sum(known) / 1e9:.2f}" if len(known) == len(sizes) else ""
            return f"downloading: {len(got)} of {len(sizes)} wheels, {sum(got.values()) / 1e9:.2f}{total} GB"

        with heartbeat(status, heartbeat_s):
            return _pip(args, {"TMPDIR": tmp})

def _pip_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip().startswith("ERROR")]
    return " ".join(lines)[:400] or proc.stderr.strip()[-400:]

@dataclass(frozen=True)
class PipSources:
    """The host's package sources, from its pip configuration (files and PIP_* variables)."""

    index_url: str = "https://pypi.org/simple"
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    cert: str | None = None
    constraints: tuple[str, ...] = ()


def pip_sources() -> PipSources:
    """What ``pip config list`` says (later lines override earlier ones, as pip's precedence)."""
    proc = _pip(["config", "list"])
    values: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        key, sep, raw = line.partition("=")
        section, _, name = key.rpartition(".")
        if sep and section in ("global", "install", "download", ":env:"):
            values[name] = raw.strip().strip("'\"")
    split = lambda k: tuple(values.get(k, "").split())
    return PipSources(values.get("index-url") or PipSources.index_url, split("extra-index-url"),
                      split("find-links"), values.get("cert") or None, split("constraint"))


def _source_url(value: str) -> str | None:
    """A source as uv takes it; None for a local one that does not exist (pip skips those too)."""
    if "://" not in value:
        path = Path(value).expanduser()
        return path.resolve().as_uri() if path.exists() else None
    if value.startswith("file://") and not Path(urllib.parse.urlparse(value).path).exists():
        return None
    return value


def uv_config(sources: PipSources, vendor_index: str | None) -> str:
    """uv.toml: the vendor index first, ``first-index``: a name it has comes only from it.

    uv's ``first-index`` strategy takes each name from the first source that has it, so a
    higher version on a later (default) index cannot shadow the vendor's (dependency confusion).
    Without a vendor index (none, or unreachable: the host's sources stand in for it), there is
    nothing to shadow, and the best match across the host's sources wins, as pip picks it.
    """
    entries = [(vendor_index, "simple")] if vendor_index else []
    entries += [(u, "simple") for u in map(_source_url, sources.extra_index_urls) if u]
    entries += [(u, "flat") for u in map(_source_url, sources.find_links) if u]
    lines = [f'index-strategy = "{"first-index" if vendor_index else "unsafe-best-match"}"']
    for url, kind in entries:
        lines += ["[[index]]", f"url = {json.dumps(url)}", f'format = "{kind}"']
    lines += ["[[index]]", f"url = {json.dumps(sources.index_url)}", "default = true"]
    return "\n".join(lines) + "\n"


def _uv(args: list[str], cert: str | None) -> subprocess.CompletedProcess[str]:
    env = child_env(UV, {"UV_NO_PROGRESS": "1", **({"SSL_CERT_FILE": cert} if cert else {})})
    return subprocess.run([find_uv_bin(), *args], capture_output=True, text=True, check=False, env=env)


def _uv_error(proc: subprocess.CompletedProcess[str]) -> str:
    text = " ".join(ln.strip() for ln in proc.stderr.splitlines() if ln.strip())
    return text[:400]


_ANNOTATED = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)==(?P<version>\S+)[^\n]*\n\s+# from (?P<index>\S+)",
                        re.MULTILINE)


def resolve(
    project: Project, requirements: list[str], platform: str, *, vendor_index: str | None = None,
    constraints: Sequence[Pin] = (), preferences: Sequence[Pin] = (),
) -> list[Pin]:
    """Resolve *requirements* for the image's *platform* with uv and fetch the wheels into the wheelhouse.

    Every name *vendor_index* has comes from it, never from the host's other sources; each pin
    records the index it came from. The versions *preferences* pins are kept where the
    requirements allow them (uv's, and pip-tools', preferences: the pins of an existing output
    file), so only what conflicts moves. Raises ``TargetFailed`` with the resolver's error.
    """
    house = wheelhouse.location()
    sources = pip_sources()
    major, minor = project.glibc
    with tempfile.TemporaryDirectory(prefix="builder-resolve-") as tmp:
        work = Path(tmp)
        _private(work / "uv.toml", uv_config(sources, vendor_index))
        (work / "requirements.in").write_text("".join(f"{r}\n" for r in requirements))
        options = ["pip", "compile", "--config-file", str(work / "uv.toml"), "--no-header", "--quiet",
                   str(work / "requirements.in"), "--python-version", project.matrix.python,
                   "--python-platform", f"{platforms.machine(platform)}-manylinux_{major}_{minor}",
                   "--only-binary", ":all:",
                   # uv's cache would keep each wheel it read metadata from unpacked (0.7 GB for one torch
                   # release) in the user's own uv cache, for good: this one goes with the resolution.
                   "--cache-dir", str(work / "uv-cache")]
        if constraints:
            (work / "constraints.txt").write_text("".join(f"{p.name}=={p.version}\n" for p in constraints))
            options += ["-c", str(work / "constraints.txt")]
        for extra in sources.constraints:
            options += ["-c", extra]
        # The resolution, with the index of each pin; the output file's pins as it stands are uv's preferences.
        (work / "annotated.txt").write_text("".join(f"{p.name}=={p.version}\n" for p in preferences))
        proc = _uv([*options, "--emit-index-annotation", "--annotation-style", "line",
                    "-o", str(work / "annotated.txt")], sources.cert)
        if proc.returncode == 0:  # the same resolution (its every pin a constraint), with each wheel's URL and hash
            proc = _uv([*options, "-c", str(work / "annotated.txt"), "-o", str(work / "pylock.toml")], sources.cert)
        if proc.returncode != 0:
            raise TargetFailed(_uv_error(proc))
        wanted = _locked_wheels(work / "annotated.txt", work / "pylock.toml")
        _download_missing(project, platform, house, wanted, work)
    return _checked_pins(project, house, wanted)


def _locked_wheels(annotated: Path, pylock: Path) -> list[tuple[Pin, str, int | None]]:
    """(pin, URL, size) of each wheel of uv's lock, the pin with the index its annotated resolution names."""
    indexes = {canonicalize_name(m["name"]): m["index"] for m in _ANNOTATED.finditer(annotated.read_text())}
    wanted = []
    for package in tomllib.loads(pylock.read_text())["packages"]:
        wheel = package["wheels"][0]
        # The wheelhouse's name for the file pip saves from this URL: its last segment, decoded as pip does.
        filename = urllib.parse.unquote(urllib.parse.urlsplit(wheel["url"]).path.rsplit("/", 1)[-1])
        index = indexes.get(canonicalize_name(package["name"]))
        if problem := wheel_name_problem(filename, package["name"], package["version"]):
            source = public(index or package.get("index") or wheel["url"])
            raise UserError(f"the index {source} serves {package['name']} {package['version']} as "
                            f"{public(wheel['url'])}: {problem}; its file URLs must end in the wheel's own file "
                            "name: fix the index, or use another one (--index, BUILDER_INDEX_*, pip's configuration)")
        wanted.append((Pin(package["name"], package["version"], wheel["hashes"]["sha256"], filename,
                           public(index) if index else None), wheel["url"], wheel.get("size")))
    return wanted


def _download_missing(project: Project, platform: str, house: Path, wanted: list[tuple[Pin, str, int | None]],
                      work: Path) -> None:
    """Download the *wanted* wheels the wheelhouse lacks, by URL and hash, into it."""
    missing = [f"{pin.name} @ {url} --hash=sha256:{pin.sha256}\n" for pin, url, _size in wanted
               if not (house / pin.filename).exists()]
    if missing:
        (work / "download.txt").write_text("".join(missing))
        proc = _download(["download", "--no-deps", "--require-hashes", "--quiet", "-d", str(work / "wheels"),
                          *platform_args(project, platform), "-r", str(work / "download.txt")],
                         {pin.filename: size for pin, _url, size in wanted if not (house / pin.filename).exists()})
        wheelhouse.adopt(work / "wheels", clone_id(project.root))
        if proc.returncode != 0:
            raise TargetFailed(_pip_error(proc))


def _checked_pins(project: Project, house: Path, wanted: list[tuple[Pin, str, int | None]]) -> list[Pin]:
    """The *wanted* pins, each wheel in the wheelhouse with its hash (one of the builder's that differs is
    removed; :func:`builder.wheels.wheelhouse.missing`)."""
    pins = [pin for pin, _url, _size in wanted]
    for pin in pins:
        if not (house / pin.filename).exists():
            raise TargetFailed(f"uv resolved {pin.filename} but pip did not download it into {house}")
    for pin in wheelhouse.missing(pins, clone_id(project.root), say=lambda _line: None)[:1]:
        raise TargetFailed(f"{pin.filename}: its sha256 does not match the index's {pin.sha256}; removed, retry")
    return pins


def _index_args(index: str) -> list[str]:
    """pip options that ask *index* first: a simple index, or a flat folder of wheels (find-links)."""
    if index.startswith("file://") and not any(p.is_dir() for p in Path(urllib.parse.urlparse(index).path).glob("*")):
        return ["--find-links", index]
    return ["--index-url", index]


def _private(path: Path, text: str) -> Path:
    """*path* (in a private temporary folder) holding *text*, readable by this user alone: an index
    given with its login goes to pip and uv in such a file, never on their command line, which
    every local user can read (/proc/<pid>/cmdline)."""
    path.touch(mode=0o600)
    path.write_text(text)
    return path


def fetch_locked(project: Project, missing: list[Pin], lock: Path, index: str | None, platform: str) -> None:
    """Download exactly *missing* by hash, for the image's platform as resolution did (not the host's).

    Each from the index its lock line records, else (none recorded, or that index fails here: a
    mirror of the machine that wrote the lock) from the target's index beside the host's sources.
    The sha256 pins the file whatever serves it, so asking another source is safe.
    """
    groups: dict[str | None, list[Pin]] = {}
    for pin in missing:
        groups.setdefault(pin.index, []).append(pin)
    errors = []
    for recorded, pins in groups.items():
        with tempfile.TemporaryDirectory(prefix="builder-fetch-") as tmp:
            req = Path(tmp) / "req.txt"
            req.write_text("".join(f"{p.name}=={p.version} --hash=sha256:{p.sha256}\n" for p in pins))
            fallback = ["-r", str(_private(Path(tmp) / "index.txt", f"--extra-index-url {index}\n"))] if index else []
            download = ["download", "--no-deps", "--require-hashes", "--quiet", "-d", str(Path(tmp) / "wheels"),
                        "-r", str(req), *platform_args(project, platform)]
            sizes: dict[str, int | None] = {p.filename: None for p in pins}
            proc = _download([*download, *(_index_args(recorded) if recorded else fallback)], sizes)
            if proc.returncode != 0 and recorded:
                proc = _download([*download, *fallback], sizes)
            wheelhouse.adopt(Path(tmp) / "wheels", clone_id(project.root))
        if proc.returncode != 0:
            errors.append(_pip_error(proc))
    if errors or wheelhouse.missing(missing, clone_id(project.root)):
        raise TargetFailed(f"fetching the wheels pinned in {lock.name} failed: {' '.join(errors)}; "
                           f"delete {lock} to re-resolve")
