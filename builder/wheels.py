"""Resolve each target's wheels on the host into a wheelhouse, with per-target hash locks.

pip runs on the host with the host's own configuration (proxies, CA bundle, find-links,
extra indexes), resolving for the image's Python and platform. Three locks result:
``images/tools.lock`` (the build-time installer), ``images/common.lock`` (the shared layer)
and ``images/<target>/requirements.lock`` (torch and friends, pinned to agree with common).
A lock whose recorded inputs are unchanged and whose wheels are present is reused as is:
a no-op rebuild never re-resolves.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.errors import TargetFailed, UserError
from builder.files import atomic_write
from builder.project import Project, ResolvedTarget
from builder.registry import state_dir
from builder.wheelmap import index_env_var

LOCK_LINE = re.compile(r"(?P<name>[A-Za-z0-9._-]+)==(?P<version>\S+) --hash=sha256:(?P<sha>[0-9a-f]{64})  # (?P<file>\S+)")


@dataclass(frozen=True)
class Pin:
    """One locked wheel."""

    name: str
    version: str
    sha256: str
    filename: str

    def line(self) -> str:
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}  # {self.filename}"


def wheelhouse() -> Path:
    """Shared wheel cache (all targets, all clones): BUILDER_WHEELHOUSE or the user cache."""
    path = Path(os.environ.get("BUILDER_WHEELHOUSE") or state_dir() / "wheels")
    path.mkdir(parents=True, exist_ok=True)
    return path


def image_arch() -> str:
    """The image platform's machine (x86_64, aarch64): builds are native, so the host's."""
    return platform.machine()


def platform_args(project: Project) -> list[str]:
    """pip options that resolve for the image, not the host: every manylinux tag its glibc allows.

    pip matches platform tags exactly, and PyPI's CUDA torch pulls wheels tagged
    manylinux_2_17 ... manylinux_2_28, so all of them must be listed.
    """
    arch = image_arch()
    major, minor = project.glibc
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1)]
    tags += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    args = ["--only-binary=:all:", "--python-version", project.matrix.python, "--implementation", "cp"]
    for tag in tags:
        args += ["--platform", tag]
    return args


def read_lock(path: Path) -> tuple[str | None, list[Pin]]:
    """The recorded input fingerprint and the pins of a lock file (None, [] if absent)."""
    if not path.exists():
        return None, []
    fingerprint, pins = None, []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# inputs: "):
            fingerprint = line.removeprefix("# inputs: ").strip()
        elif (m := LOCK_LINE.fullmatch(line)) is not None:
            pins.append(Pin(m["name"], m["version"], m["sha"], m["file"]))
    return fingerprint, pins


def _ordered(pins: list[Pin]) -> list[Pin]:
    """Lock-file order: pip's report order varies, a lock and a fingerprint must not."""
    return sorted(pins, key=lambda p: canonicalize_name(p.name))


def write_lock(path: Path, what: str, fingerprint: str, pins: list[Pin]) -> None:
    header = [
        f"# Hash lock for {what}: written by `builder lock`; do not edit (delete it to re-resolve).",
        f"# inputs: {fingerprint}",
    ]
    body = [p.line() for p in _ordered(pins)]
    atomic_write(path, "\n".join(header + body) + "\n")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fingerprint(*parts: object) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def index_reachable(url: str, timeout: float = 8.0) -> str | None:
    """None if the index answers, else the reason it does not (one short phrase)."""
    if url.startswith("file://"):
        return None if Path(urllib.parse.urlparse(url).path).exists() else "no such folder"
    context = ssl.create_default_context(cafile=os.environ.get("PIP_CERT") or None)
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/", timeout=timeout, context=context):
            return None
    except urllib.error.HTTPError as exc:
        return None if exc.code < 500 else f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return str(reason)[:120]


def _pip(args: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", "--retries", "1", "--timeout", "30", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def _pip_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip().startswith("ERROR")]
    return " ".join(lines)[:400] or proc.stderr.strip()[-400:]


def resolve(
    project: Project, requirements: list[str], *, extra_index: str | None = None, constraints: list[Pin] = ()
) -> list[Pin]:
    """Resolve *requirements* for the image platform and fetch the wheels into the wheelhouse.

    Raises ``TargetFailed`` with pip's error when nothing satisfies them.
    """
    house = wheelhouse()
    with tempfile.TemporaryDirectory(prefix="builder-resolve-") as tmp:
        report = Path(tmp) / "report.json"
        options = platform_args(project)
        if extra_index:
            options += ["--extra-index-url", extra_index]
        if constraints:
            cfile = Path(tmp) / "constraints.txt"
            cfile.write_text("".join(f"{p.name}=={p.version}\n" for p in constraints))
            options += ["-c", str(cfile)]
        proc = _pip(["install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
                     "--target", str(Path(tmp) / "t"), *options, *requirements])
        if proc.returncode != 0:
            raise TargetFailed(_pip_error(proc))
        items = json.loads(report.read_text())["install"]
        wanted = []
        for item in items:
            name, version = item["metadata"]["name"], item["metadata"]["version"]
            filename = urllib.parse.unquote(item["download_info"]["url"].rsplit("/", 1)[-1].split("#")[0])
            wanted.append((name, version, filename, item["download_info"].get("archive_info", {})))
        missing = [f"{n}=={v}" for n, v, f, _ in wanted if not (house / f).exists()]
        if missing:
            proc = _pip(["download", "--no-deps", "--quiet", "-d", str(house), *options, *missing])
            if proc.returncode != 0:
                raise TargetFailed(_pip_error(proc))
    pins = []
    for name, version, filename, archive in wanted:
        path = house / filename
        if not path.exists():
            raise TargetFailed(f"pip resolved {filename} but did not download it into {house}")
        sha = sha256_file(path)
        expected = (archive.get("hashes") or {}).get("sha256")
        if expected and expected != sha:
            path.unlink()
            raise TargetFailed(f"{filename}: sha256 {sha} does not match the index's {expected}; removed, retry")
        pins.append(Pin(name, version, sha, filename))
    _remember(house, {p.filename: _stamp(house / p.filename, p.sha256) for p in pins})
    return pins


#: Sidecar in the wheelhouse: {file: [size, mtime_ns, sha256]} of files whose hash was checked.
VERIFIED = ".verified.json"


def _stamp(path: Path, sha256: str) -> list[object]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, sha256]


def _stamps(house: Path) -> dict[str, list[object]]:
    try:
        data = json.loads((house / VERIFIED).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _remember(house: Path, changes: dict[str, list[object] | None]) -> None:
    """Merge *changes* (None: forget) into the stamps; re-read first, other builds share the file."""
    if not changes:
        return
    stamps = _stamps(house)
    for name, stamp in changes.items():
        if stamp is None:
            stamps.pop(name, None)
        else:
            stamps[name] = stamp
    atomic_write(house / VERIFIED, json.dumps(stamps, sort_keys=True, indent=1) + "\n")


def _missing(pins: list[Pin]) -> list[Pin]:
    """The pins whose wheel is not in the wheelhouse with its locked sha256; a wrong file is removed.

    Hashing every locked file on each no-op build is too slow (CUDA torch is ~3 GB), so a
    verified (size, mtime_ns, sha256) is remembered per file and only changed files are re-hashed.
    """
    house = wheelhouse()
    stamps = _stamps(house)
    missing, changes = [], {}
    for pin in pins:
        path = house / pin.filename
        try:
            stamp = _stamp(path, pin.sha256)
        except FileNotFoundError:
            missing.append(pin)
            continue
        if stamps.get(pin.filename) == stamp:
            continue
        if sha256_file(path) == pin.sha256:
            changes[pin.filename] = stamp
        else:  # truncated or replaced: never serve it to a build
            path.unlink(missing_ok=True)
            changes[pin.filename] = None
            missing.append(pin)
    _remember(house, changes)
    return missing


def _ensure(project: Project, path: Path, what: str, fingerprint: str, resolver,  # type: ignore[no-untyped-def]
            index=lambda: None) -> list[Pin]:
    """Reuse the lock when its inputs are unchanged and its wheels are here, intact; else resolve."""
    recorded, pins = read_lock(path)
    if recorded == fingerprint and pins:
        missing = _missing(pins)
        if missing:
            # Locked but not downloaded (fresh clone, new runner) or damaged: fetch exactly the locked files.
            _fetch_locked(project, missing, path, index())
        return pins
    pins = resolver()
    write_lock(path, what, fingerprint, pins)
    return pins


def _fetch_locked(project: Project, missing: list[Pin], lock: Path, index: str | None) -> None:
    """Download exactly *missing* by hash, for the image's platform as resolution did (not the host's)."""
    house = wheelhouse()
    with tempfile.TemporaryDirectory(prefix="builder-fetch-") as tmp:
        req = Path(tmp) / "req.txt"
        req.write_text("".join(f"{p.name}=={p.version} --hash=sha256:{p.sha256}\n" for p in missing))
        proc = _pip(["download", "--no-deps", "--require-hashes", "--quiet", "-d", str(house), "-r", str(req),
                     *platform_args(project)] + (["--extra-index-url", index] if index else []))
    if proc.returncode != 0 or _missing(missing):
        raise TargetFailed(f"fetching the wheels pinned in {lock.name} failed: {_pip_error(proc)}; "
                           f"delete {lock} to re-resolve")


def tools_lock(project: Project) -> list[Pin]:
    """images/tools.lock: the installer used during builds (never left in an image)."""
    m = project.matrix
    fp = _fingerprint("tools", m.installer, m.python, project.glibc, image_arch())
    return _ensure(project, project.images_dir / "tools.lock", "the build-time installer", fp,
                   lambda: resolve(project, [m.installer]))


def common_lock(project: Project) -> list[Pin]:
    """images/common.lock: the backend-independent layer shared by every target."""
    m = project.matrix
    fp = _fingerprint("common", sorted(m.common_packages), m.python, project.glibc, image_arch())
    return _ensure(project, project.images_dir / "common.lock", "the shared layer of every target", fp,
                   lambda: resolve(project, list(m.common_packages)))


def target_lock(project: Project, target: ResolvedTarget, common: list[Pin]) -> list[Pin]:
    """images/<target>/requirements.lock: torch and the target's packages, minus the common layer."""
    path = project.root / target.lock
    requirements = [f"torch=={target.torch_pin}", *target.packages]
    # In lock order: just resolved (pip's order) or read back, the same common pins give the same hash.
    common_hash = _fingerprint([p.line() for p in _ordered(common)])
    fp = _fingerprint("target", target.entry, requirements, project.matrix.python, project.glibc,
                      image_arch(), common_hash)

    def resolver() -> list[Pin]:
        unreachable = index_reachable(target.index_url)
        try:
            pins = resolve(project, requirements, extra_index=None if unreachable else target.index_url,
                           constraints=common)
        except TargetFailed as exc:
            where = f"the index {target.index_url} ({target.entry})"
            how = f"point it at a mirror with {index_env_var(target.entry)}=URL or --index {target.entry}=URL"
            if unreachable:
                raise TargetFailed(f"torch=={target.torch_pin} is not available: {where} is unreachable from "
                                   f"this host ({unreachable}) and pip's own sources lack it; {how}") from None
            raise TargetFailed(f"resolving {' '.join(requirements)} from {where} failed: {exc}; {how}") from None
        check_torch_flavour(target, pins)  # before the lock is written
        shared = {canonicalize_name(p.name) for p in common}
        return [p for p in pins if canonicalize_name(p.name) not in shared]

    def index() -> str | None:
        return None if index_reachable(target.index_url) else target.index_url

    pins = _ensure(project, path, f"target {target.name}", fp, resolver, index)
    check_torch_flavour(target, pins)  # a reused lock, too
    return pins


def check_torch_flavour(target: ResolvedTarget, pins: list[Pin]) -> None:
    """The locked torch must be the target's build: ``==2.13.0`` also matches ``2.13.0+cpu``, which
    PEP 440 ranks above the bare version, so a +cpu wheel among pip's sources wins on a cuda target."""
    expected = Version(target.torch_pin)
    torch = next((p for p in pins if canonicalize_name(p.name) == "torch"), None)
    try:
        got = Version(torch.version) if torch else None
    except InvalidVersion:
        got = None
    if got == expected:
        return
    want = f"+{expected.local}" if expected.local else "no local label (PyPI's default build)"
    found = f"resolved torch {torch.version}" if torch else "locked no torch"
    raise TargetFailed(
        f"target {target.name}: {found}, expected {target.torch_pin} ({want}); fix: remove that wheel or "
        f"its source from pip's configuration (`pip config list`: find-links, extra-index-url) so "
        f"{target.index_url} supplies torch, delete {target.lock} if it holds the wrong torch, and run "
        f"`builder lock -t {target.name}`"
    )


def lock_all(project: Project, targets: list[ResolvedTarget], say) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Lock tools, common and every target; return {target: error} for targets that failed."""
    try:
        tools_lock(project)
        common = common_lock(project)
    except TargetFailed as exc:
        raise UserError(f"resolving the shared packages failed: {exc}") from None
    failed = {}
    for target in targets:
        try:
            pins = target_lock(project, target, common)
            say(f"{target.name}: {len(pins)} wheels locked in {target.lock}")
        except TargetFailed as exc:
            failed[target.name] = str(exc)
    return failed
