"""Build a target with BuildKit through the Docker CLI (for users whose builder is BuildKit).

Same contract as ``builder.build.docker_build``: the same rendered Dockerfile, the project
root as context (the same files: see ``context_tar``), ``--network host`` and the wheel
server's name mapped to this build's loopback address, and the same return value
(image ID, cacheable steps, steps from cache). BuildKit lists only the steps that touch the
file system (FROM, WORKDIR, COPY, RUN, ...): FROM is left out as in ``docker_build``, and
metadata steps (ENV, LABEL, USER, ...) never appear, so the counts are smaller than the
classic builder's for the same Dockerfile; ``cached == steps`` still means "nothing ran".

The client: ``docker buildx build --load`` when a ``docker`` on PATH has the buildx plugin,
else ``DOCKER_BUILDKIT=1 docker build`` with a client older than 23 (Debian's 20.10 at
/usr/bin/docker); newer clients without buildx refuse BuildKit.

Example:
    >>> with wheelserver.serve(wheels.wheelhouse(), project.matrix.wheelhouse_port) as at:
    ...     image_id, steps, cached = buildkit_build(project, project.target("cpu"), wheels_at=at)
    >>> image_id.startswith("sha256:"), cached <= steps
    (True, True)
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import docker.utils.build
from packaging.version import InvalidVersion, Version

from builder import wheelserver
from builder.build import build_labels
from builder.errors import TargetFailed, UserError
from builder.project import Project, ResolvedTarget

#: ``#7 [common 2/5] RUN ...`` (multi-stage) or ``#5 [2/2] RUN ...`` (single stage).
STEP = re.compile(r"^#(\d+) \[(?:(\S+) )?(\d+)/(\d+)\] (.*)$")
CACHED = re.compile(r"^#(\d+) CACHED\s*$")
VERTEX_ERROR = re.compile(r"^#(\d+) ERROR: (.*)$")
#: A step's own error output, e.g. ``#8 2.113 ERROR: Could not find a version that satisfies ...``.
STEP_OUTPUT_ERROR = re.compile(r"^#\d+ \d+\.\d+ ((?:ERROR|error)\b.*)$")
#: Clients from 23.0 on need the buildx plugin for BuildKit; older ones drive it themselves.
LAST_LEGACY_CLIENT = Version("23")


@dataclass(frozen=True)
class Cli:
    """A Docker CLI able to run BuildKit builds, and how (buildx or DOCKER_BUILDKIT=1)."""

    path: str
    buildx: bool

    def argv(self) -> list[str]:
        return [self.path, "buildx", "build", "--load"] if self.buildx else [self.path, "build"]

    def env(self) -> dict[str, str]:
        return {**os.environ, **({} if self.buildx else {"DOCKER_BUILDKIT": "1"})}


def _candidates() -> list[str]:
    """Every ``docker`` on PATH, then Debian's client; each real file once."""
    found, seen = [], set()
    dirs = os.environ.get("PATH", "").split(os.pathsep) + ["/usr/bin"]
    for folder in dirs:
        path = Path(folder or ".") / "docker"
        if path.is_file() and os.access(path, os.X_OK) and path.resolve() not in seen:
            seen.add(path.resolve())
            found.append(str(path))
    return found


def _client_version(path: str) -> Version | None:
    """The client version from ``docker --version`` (no engine needed), e.g. 20.10.24."""
    proc = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    m = re.search(r"version (\d+(?:\.\d+)*)", proc.stdout)
    try:
        return Version(m[1]) if m else None
    except InvalidVersion:
        return None


def _has_buildx(path: str) -> bool:
    proc = subprocess.run([path, "buildx", "version"], capture_output=True, text=True, check=False)
    return proc.returncode == 0


def find_cli(candidates: list[str] | None = None) -> Cli:
    """The first client with buildx, else the first one older than 23; UserError when none.

    Example:
        >>> find_cli()
        Cli(path='/usr/bin/docker', buildx=False)
    """
    paths = _candidates() if candidates is None else candidates
    for path in paths:
        if _has_buildx(path):
            return Cli(path, buildx=True)
    for path in paths:
        version = _client_version(path)
        if version is not None and version < LAST_LEGACY_CLIENT:
            return Cli(path, buildx=False)
    tried = ", ".join(f"{p} ({_client_version(p) or 'unknown version'})" for p in paths) or "no docker on PATH"
    raise UserError(
        f"BuildKit needs the docker buildx plugin or a Docker client older than 23; tried {tried}. "
        "Install buildx (apt-get install docker-buildx, or docker-buildx-plugin from Docker's repository) "
        "or Debian's 20.10 client (apt-get install docker.io) at /usr/bin/docker"
    )


def build_argv(
    cli: Cli,
    project: Project,
    target: ResolvedTarget,
    iidfile: Path,
    *,
    stage: str | None = None,
    cache_from: list[str] | None = None,
    labels: dict[str, str] | None = None,
    wheels_at: str = "127.0.0.1",
) -> list[str]:
    """The full command line (pure, for tests and ``--dry-run``-style printing)."""
    argv = [*cli.argv(), "--progress", "plain", "--iidfile", str(iidfile),
            # The loopback wheel server, at this build's own address (see builder.wheelserver).
            "--network", "host", "--add-host", f"{wheelserver.HOST}:{wheels_at}",
            "-f", target.dockerfile,
            # Inline cache metadata: a pushed image can then serve as --cache-from elsewhere.
            "--build-arg", "BUILDKIT_INLINE_CACHE=1"]
    if stage:
        argv += ["--target", stage]
    for ref in cache_from or []:
        argv += ["--cache-from", f"type=registry,ref={ref}" if cli.buildx and "=" not in ref else ref]
    for key, value in (labels or {}).items():
        argv += ["--label", f"{key}={value}"]
    return [*argv, "-"]  # the context comes on stdin: see context_tar


def context_tar(project: Project, target: ResolvedTarget) -> IO[bytes]:
    """The project root as a tar, filtered by .dockerignore exactly as docker-py does for ``docker_build``.

    Why not let the CLI read the folder: BuildKit in Docker 20.10 drops files that an
    exception with a wildcard in a folder part re-includes (``!images/*/requirements.lock``),
    so the same .dockerignore would give BuildKit a different context than the classic build.
    """
    ignore = project.root / ".dockerignore"
    lines = ignore.read_text(encoding="utf-8").splitlines() if ignore.is_file() else []
    patterns = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
    # gzip: the CLI sniffs the first KB of stdin for a tar; docker-py's PAX headers are longer than that.
    return docker.utils.build.tar(str(project.root), exclude=patterns, dockerfile=(target.dockerfile, None),
                                    gzip=True)


@dataclass
class _Steps:
    """Step accounting over BuildKit's plain progress: vertices may be reprinted, so by number."""

    names: dict[int, str]
    cached: set[int]
    errors: list[str]

    def feed(self, line: str) -> tuple[int, int, str] | None:
        if (m := STEP.match(line)) is not None:
            vertex, text = int(m[1]), m[5].strip()
            if text.startswith("FROM ") or vertex in self.names:
                return None  # FROM starts a stage and is never "from cache", as in docker_build
            self.names[vertex] = text
            return int(m[3]), int(m[4]), f"[{m[2]}] {text}" if m[2] else text
        if (m := CACHED.match(line)) is not None:
            self.cached.add(int(m[1]))
        elif (m := VERTEX_ERROR.match(line)) is not None:
            name = self.names.get(int(m[1]), f"step #{m[1]}")
            self.errors.append(f"{name[:120]}: {m[2].strip()}")
        return None

    def counts(self) -> tuple[int, int]:
        return len(self.names), len(self.cached & set(self.names))


def buildkit_build(
    project: Project,
    target: ResolvedTarget,
    *,
    stage: str | None = None,
    cache_from: list[str] | None = None,
    labels: dict[str, str] | None = None,
    on_step: Callable[[int, int, str], None] = lambda n, total, text: None,
    on_log: Callable[[str], None] = lambda line: None,
    wheels_at: str = "127.0.0.1",
) -> tuple[str, int, int]:
    """Build one target (or one stage) with BuildKit; return (image ID, cacheable steps, steps from cache).

    ``labels`` default to the per-commit build labels for a whole target (none for a stage),
    exactly as ``docker_build`` applies them. ``on_step`` gets BuildKit's per-stage numbers.
    ``wheels_at`` is the address ``wheelserver.serve`` yielded; the server must be running.
    Raises ``TargetFailed`` with the build's error lines.
    """
    cli = find_cli()
    if labels is None and stage is None:
        labels = build_labels(project.root)
    steps = _Steps({}, set(), [])
    tail: list[str] = []
    with tempfile.TemporaryDirectory(prefix="builder-buildkit-") as tmp:
        iidfile = Path(tmp) / "iid"
        argv = build_argv(cli, project, target, iidfile, stage=stage, cache_from=cache_from, labels=labels,
                          wheels_at=wheels_at)
        with context_tar(project, target) as context:
            proc = subprocess.Popen(argv, cwd=project.root, env=cli.env(), stdin=context,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        assert proc.stdout is not None
        try:
            for raw in proc.stdout:
                line = raw.rstrip()
                if (step := steps.feed(line)) is not None:
                    on_step(*step)
                if line.strip():
                    on_log(line)
                    tail = [*tail[-39:], line]
        except BaseException:
            proc.terminate()  # Ctrl-C: the client cancels the build on SIGTERM
            proc.wait()
            raise
        code = proc.wait()
        image_id = iidfile.read_text().strip() if iidfile.exists() else ""
    if code != 0:
        raise TargetFailed(_failure(target, code, steps.errors, tail))
    if not image_id:
        raise TargetFailed(f"{cli.path} finished the build of {target.name} without writing an image ID")
    return (image_id, *steps.counts())


def _failure(target: ResolvedTarget, code: int, vertex_errors: list[str], tail: list[str]) -> str:
    """The lines that say why: failing steps, their own ERROR output, the client's final error, a hint."""
    final = [ln for ln in tail if ln.lower().startswith(("error", "failed to solve")) or ln.startswith(" > ")]
    own = [m[1] for ln in tail if (m := STEP_OUTPUT_ERROR.match(ln))][:5]
    lines = vertex_errors + own + final or tail[-8:]
    text = "; ".join(dict.fromkeys(ln.strip() for ln in lines if ln.strip()))
    if wheelserver.HOST in "\n".join(tail) and "Connection refused" in "\n".join(tail):
        text += " (the wheel server was not reachable: is the engine on this host? --network host needs it)"
    return f"BuildKit build of {target.name} failed (exit {code}): {text[:2000]}"

