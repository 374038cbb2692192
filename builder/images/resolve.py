"""pip on the host, resolving for the image: platform tags, index probes, wheels fetched by hash.

pip runs with the host's own configuration (proxies, CA bundle, find-links, extra indexes),
for the image's Python and every manylinux tag its glibc allows, and downloads into the
wheelhouse (:mod:`builder.images.wheelhouse`).
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from builder.config import platforms
from builder.config.errors import TargetFailed
from builder.config.project import Project
from builder.images import wheelhouse
from builder.images.lockfile import Pin


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
    project: Project, requirements: list[str], platform: str, *, extra_index: str | None = None,
    constraints: Sequence[Pin] = (),
) -> list[Pin]:
    """Resolve *requirements* for the image's *platform* and fetch the wheels into the wheelhouse.

    Raises ``TargetFailed`` with pip's error when nothing satisfies them.
    """
    house = wheelhouse.location()
    with tempfile.TemporaryDirectory(prefix="builder-resolve-") as tmp:
        report = Path(tmp) / "report.json"
        options = platform_args(project, platform)
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
        sha = wheelhouse.sha256_file(path)
        expected = (archive.get("hashes") or {}).get("sha256")
        if expected and expected != sha:
            path.unlink()
            raise TargetFailed(f"{filename}: sha256 {sha} does not match the index's {expected}; removed, retry")
        pins.append(Pin(name, version, sha, filename))
    wheelhouse.remember(house, {p.filename: wheelhouse.stamp(house / p.filename, p.sha256) for p in pins})
    return pins

def fetch_locked(project: Project, missing: list[Pin], lock: Path, index: str | None, platform: str) -> None:
    """Download exactly *missing* by hash, for the image's platform as resolution did (not the host's)."""
    house = wheelhouse.location()
    with tempfile.TemporaryDirectory(prefix="builder-fetch-") as tmp:
        req = Path(tmp) / "req.txt"
        req.write_text("".join(f"{p.name}=={p.version} --hash=sha256:{p.sha256}\n" for p in missing))
        proc = _pip(["download", "--no-deps", "--require-hashes", "--quiet", "-d", str(house), "-r", str(req),
                     *platform_args(project, platform)] + (["--extra-index-url", index] if index else []))
    if proc.returncode != 0 or wheelhouse.missing(missing):
        raise TargetFailed(f"fetching the wheels pinned in {lock.name} failed: {_pip_error(proc)}; "
                           f"delete {lock} to re-resolve")
