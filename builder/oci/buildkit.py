"""Builds through BuildKit: ``docker buildx build``, driven as a subprocess.

docker-py drives only the legacy builder (docker-py#2230), so builds go through the buildx CLI;
docker-py stays for everything else (inspect, tag, push, smoke runs). A
:class:`~builder.oci.engine.BuildRequest` is a pure plan (what ``builder print`` and the bake file show);
:func:`argv` is its command line, :func:`run` executes it, reads
BuildKit's own progress events (``--progress=rawjson``, :mod:`builder.oci.buildevents`) and returns
the image's ID; :class:`EarlyExports` runs more builds beside it.

The builder is the user's choice: ``--builder NAME`` or ``BUILDX_BUILDER`` (a team's remote
BuildKit, a Kubernetes-driver farm); the default is the engine's own (the ``docker`` driver).
Every build gets the engine's environment (``DOCKER_HOST``), so a builder on another engine is
a docker context or ``BUILDX_BUILDER`` away.

Example:
    >>> argv(BuildRequest(dockerfile="images/cpu/Dockerfile", context=".", platform="linux/amd64"))[:4]
    ['docker', 'buildx', 'build', '--progress=rawjson']
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, TypeVar

from builder.config.errors import TargetFailed, UserError
from builder.oci.buildevents import Lines, Phases, Steps, events
from builder.oci.engine import BuildRequest, BuildResult
from builder.oci.secrets import ENGINE, child_env

#: How long a cancelled build may take to stop after SIGINT before it is killed.
CANCEL_S = 20.0


def compression_options(compression: str) -> str:
    """The exporter options for *compression*, forced onto every layer: without the force BuildKit
    reuses whatever blob it holds for a layer, so a gzip image built after a zstd one of the same
    layers got zstd blobs, which enroot, pyxis and engines before 23 cannot pull. A blob already in
    that compression is kept as it is. zstd layers get OCI media types: with Docker's (the docker
    exporter's default) BuildKit labels them ``vnd.docker.image.rootfs.diff.tar.zstd``, a type no
    engine unpacks, so the push succeeds and every pull fails ("mismatched image rootfs and
    manifest layers"). gzip keeps Docker's types, which every engine and enroot read.

    Example:
        >>> compression_options("gzip")
        'compression=gzip,force-compression=true'
        >>> compression_options("zstd")
        'compression=zstd,force-compression=true,oci-mediatypes=true'
    """
    media = ",oci-mediatypes=true" if compression == "zstd" else ""
    return f"compression={compression},force-compression=true{media}"


def output(request: BuildRequest) -> str:
    """The ``--output`` of *request*: the image store, in its compression (an early export: nothing stored)."""
    if request.stage is not None and request.stage in request.early_stages:
        return f"type=image,store=false,{compression_options(request.compression)}"
    return f"type=docker,{compression_options(request.compression)}"

def argv(request: BuildRequest, iidfile: str | None = None, metadata: str | None = None) -> list[str]:
    """The ``docker buildx build`` command line of *request* (no shell: values can't inject anything)."""
    line = ["docker", "buildx", "build", "--progress=rawjson", "--provenance=false", "--sbom=false"]
    if request.builder:
        line += ["--builder", request.builder]
    line += ["--file", request.dockerfile, "--platform", request.platform]
    if request.stage:
        line += ["--target", request.stage]
    for key, value in request.build_args.items():
        line += ["--build-arg", f"{key}={value}"]
    for name, path in request.contexts.items():
        line += ["--build-context", f"{name}={path}"]
    for key, value in request.labels.items():
        line += ["--label", f"{key}={value}"]
    for source in request.cache_from:
        line += ["--cache-from", source]
    for sink in request.cache_to:
        line += ["--cache-to", sink]
    if request.no_cache:
        line.append("--no-cache")
    for tag in request.tags:
        line += ["--tag", tag]
    line += ["--output", output(request)]
    if iidfile:
        line += ["--iidfile", iidfile]
    if metadata:
        line += ["--metadata-file", metadata]
    line.append(request.context)
    return line


#: Why no build can start: the one message for it (:func:`available`, :func:`run`).
NO_DOCKER_CLI = "the docker CLI is not installed (apt-get install docker.io)"


def version() -> str:
    """``docker buildx version``'s line (empty when buildx is missing)."""
    if shutil.which("docker") is None:
        return ""
    proc = subprocess.run(["docker", "buildx", "version"], capture_output=True, text=True, check=False, env=child_env(ENGINE))
    return proc.stdout.strip() if proc.returncode == 0 else ""


def builder_problem(name: str, docker_host: str) -> str | None:
    """Why builder *name* can't serve builds whose images the engine at *docker_host* must then hold.

    A ``docker``-driver builder builds in its own engine and keeps the image there; buildx uses it
    only as the current docker context, so the engine's address is what selects it (DOCKER_HOST).
    Every other driver (docker-container, remote, kubernetes) loads the result into DOCKER_HOST's
    engine, wherever it builds.
    """
    proc = subprocess.run(["docker", "buildx", "inspect", name], capture_output=True, text=True, check=False, env=child_env(ENGINE))
    if proc.returncode != 0:
        return (f"buildx builder {name!r} is unknown ({(proc.stderr.strip().splitlines() or ['?'])[-1][:160]}); "
                "list them with: docker buildx ls")
    fields = dict(line.split(":", 1) for line in proc.stdout.splitlines() if ":" in line)
    if fields.get("Driver", "").strip() != "docker" or name == "default":
        return None
    endpoint = subprocess.run(["docker", "context", "inspect", name, "--format", "{{.Endpoints.docker.Host}}"],
                              capture_output=True, text=True, check=False, env=child_env(ENGINE)).stdout.strip() or name
    if endpoint == docker_host:
        return f"buildx builder {name!r} is this engine's own: leave --builder and BUILDX_BUILDER out"
    return (f"buildx builder {name!r} is the docker driver of the engine at {endpoint}, which keeps what it "
            f"builds; builder smoke-tests and pushes on {docker_host}: set DOCKER_HOST={endpoint}, or use a "
            "docker-container, remote or kubernetes builder (those load into DOCKER_HOST's engine)")


def available() -> str | None:
    """Why builds can't run here (no buildx), or None."""
    if shutil.which("docker") is None:
        return NO_DOCKER_CLI
    proc = subprocess.run(["docker", "buildx", "version"], capture_output=True, text=True, check=False, env=child_env(ENGINE))
    if proc.returncode != 0:
        return "docker buildx is not installed (apt-get install docker-buildx): builds need BuildKit"
    return None


@contextlib.contextmanager
def docker_config(host: str | None, creds: dict[str, str] | None) -> Iterator[dict[str, str]]:
    """The environment for buildx: without the registry and signing secrets (secrets.child_env); with
    *creds* for *host* (from BUILDER_REGISTRY_*), a private DOCKER_CONFIG naming them, removed
    afterwards; the build never sees them as arguments."""
    env = child_env(ENGINE)
    if not host or not creds:
        yield env
        return

    with tempfile.TemporaryDirectory(prefix="builder-buildx-") as tmp:
        source = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")
        config: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            config = json.loads((source / "config.json").read_text())
        if (source / "buildx").is_dir():  # the user's builders (BUILDX_BUILDER, --builder) stay known
            os.symlink(source / "buildx", Path(tmp) / "buildx")
        if (source / "contexts").is_dir():
            os.symlink(source / "contexts", Path(tmp) / "contexts")
        if (source / "cli-plugins").is_dir():
            os.symlink(source / "cli-plugins", Path(tmp) / "cli-plugins")
        token = base64.b64encode(f"{creds['username']}:{creds['password']}".encode()).decode()
        config.pop("credsStore", None)
        config.setdefault("auths", {})[host] = {"auth": token}
        path = Path(tmp) / "config.json"
        path.touch(mode=0o600)
        path.write_text(json.dumps(config))
        yield child_env(ENGINE, {"DOCKER_CONFIG": tmp})


#: A Dockerfile step's vertex, by stage (``[wheel-layer-torch 1/1] RUN ...``).
EARLY_STEP = re.compile(r"^\[(?P<stage>[^\]\s]+) \d+/\d+\] ")


class EarlyExports:
    """The early exports of :attr:`BuildRequest.early_stages`: for each stage a second ``docker buildx
    build`` to it, its layers compressed as the image's, nothing stored, started when the stage's
    first step runs (not cached: a cached step's layer has its blob). BuildKit runs a step every
    build asks for once and computes a layer's blob once, so each wheel layer is compressed while
    the layers above it install and the image's export reuses them. Stopped when the image's build
    ends; a failure fails nothing. BuildKit keeps a copy of each folder context per session, as for
    the image's (docs/speed.md): the first early exports after those copies were pruned send them
    again (the contexts as images send nothing)."""

    def __init__(self, request: BuildRequest, env: dict[str, str], cwd: Path | None, folder: Path) -> None:
        self.requests = {stage: replace(request, stage=stage, labels={}, tags=(), cache_from=(), cache_to=())
                         for stage in request.early_stages}
        self.env, self.cwd, self.folder = env, cwd, folder
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def see(self, vertex: dict[str, Any]) -> None:
        """One vertex event of the image's build: a stage's early export starts with its first step that runs."""
        if vertex.get("cached") or vertex.get("completed") or not vertex.get("started"):
            return
        step = EARLY_STEP.match(vertex.get("name", ""))
        if step is None or step["stage"] not in self.requests or step["stage"] in self.procs:
            return
        with self._log(step["stage"]).open("w") as log:
            self.procs[step["stage"]] = subprocess.Popen(
                argv(self.requests[step["stage"]]), stdout=subprocess.DEVNULL, stderr=log, text=True,
                env=self.env, cwd=self.cwd, start_new_session=True)

    def stop(self) -> None:
        """Every one still running gets SIGINT at once, then each its time to stop (:func:`_stop`)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGINT)
        for proc in self.procs.values():
            _stop(proc)

    def seconds(self) -> dict[str, float]:
        """Their export's seconds (``export: early``), from their own events: the first layer's
        compression started to the last one's end; none when none ran."""
        windows: list[tuple[float, float]] = []
        for stage in self.procs:
            phases = Phases()
            with contextlib.suppress(OSError), self._log(stage).open() as stream:
                for event in events(stream):
                    for status in event.get("statuses") or []:
                        phases.update_status(status)
            windows += filter(None, [phases.window("export: layers")])
        if not windows:
            return {}
        return {"export: early": round(max(end for _, end in windows) - min(start for start, _ in windows), 2)}

    def _log(self, stage: str) -> Path:
        return self.folder / f"early-{stage}.log"


def run(
    request: BuildRequest,
    *,
    on_step: Callable[[int, int, str], None] = lambda n, total, text: None,
    on_log: Callable[[str], None] = lambda line: None,
    cancel: threading.Event | None = None,
    registry_host: str | None = None,
    creds: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> BuildResult:
    """Run one build; return the image's ID. A failed build raises TargetFailed with BuildKit's error.

    Relative paths in *request* are relative to *cwd* (the project's root). Once *cancel* is set, buildx gets SIGINT (it cancels the build in BuildKit: no container
    or half-made image stays), then SIGKILL if it has not stopped within CANCEL_S.
    """
    if shutil.which("docker") is None:
        raise UserError(NO_DOCKER_CLI)
    steps, phases = Steps(), Phases()
    with tempfile.TemporaryDirectory(prefix="builder-build-") as tmp, docker_config(registry_host, creds) as env:
        metadata = Path(tmp) / "metadata.json"
        # BUILDX_GIT_INFO=0: buildx would run seven git commands (0.17 s) for provenance this build does not make.
        env = {**env, "BUILDX_GIT_INFO": "0"}
        proc = subprocess.Popen(argv(request, metadata=str(metadata)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env=env, cwd=cwd,
                                start_new_session=True)  # a terminal's Ctrl-C reaches us, and we cancel it
        stderr = proc.stderr
        assert stderr is not None
        early = EarlyExports(request, env, cwd, Path(tmp)) if request.early_stages and not request.stage else None
        try:
            errors, code = supervised(proc, cancel, lambda: _follow(stderr, steps, on_step, on_log, phases=phases, early=early))
        finally:
            if early is not None:
                early.stop()
        early_seconds = early.seconds() if early is not None else {}
        if code != 0:
            # buildx is asked only now, after a failure: asking before every build cost 0.2 s each.
            if (problem := available()) is not None:
                raise UserError(problem)
            raise TargetFailed(_build_error(errors, code))
        try:
            made = json.loads(metadata.read_text())
        except (OSError, ValueError):
            made = {}
    ids = tuple(d for key in ("containerimage.digest", "containerimage.config.digest") if (d := made.get(key)))
    if not ids:
        raise TargetFailed("BuildKit finished the build without naming the image it made")
    return BuildResult(ids, len(steps.names), len(steps.cached), tuple(steps.cache_read),
                       {**phases.seconds(), **early_seconds})


def _follow(stream: IO[str], steps: Steps, on_step: Callable[[int, int, str], None],
            on_log: Callable[[str], None], *, phases: Phases | None = None,
            early: EarlyExports | None = None) -> list[str]:
    """Read buildx's progress to its end, *steps*, *phases*, *early* and the callbacks following it;
    return the errors it reported."""
    lines = Lines()
    errors: list[str] = []
    current = "starting"
    for event in events(stream):
        if "text" in event:
            errors.append(event["text"])
            continue
        if phases is not None:
            for status in event.get("statuses") or []:
                phases.update_status(status)
        for vertex in event.get("vertexes") or []:
            if phases is not None:
                phases.update(vertex)
            if early is not None:
                early.see(vertex)
            if (started := steps.update(vertex)) is not None:
                current = started
                on_log(f"#{len(steps.names)} {' '.join(started.split())}")  # a step's own line
            elif vertex.get("started") and not vertex.get("completed") and vertex.get("name"):
                current = vertex["name"]  # BuildKit's own work: exporting, pushing, a cache read
            on_step(len(steps.done), max(len(steps.names), 1), current)
            if vertex.get("error"):
                errors.append(vertex["error"])
        for line in lines.feed(event):
            on_log(line)
    for line in lines.rest():
        on_log(line)
    return errors


T = TypeVar("T")


def supervised(proc: subprocess.Popen[str], cancel: threading.Event | None, follow: Callable[[], T]) -> tuple[T, int]:
    """(what *follow* read of the build process *proc*'s output, its exit code): the build is stopped
    when *cancel* is set (TargetFailed "interrupted") or when following it raises (Ctrl-C included)."""
    if cancel is not None:
        threading.Thread(target=_cancel_on, args=(proc, cancel), daemon=True).start()
    try:
        read = follow()
        code = proc.wait()
    except BaseException:
        _stop(proc)
        raise
    if cancel is not None and cancel.is_set():
        raise TargetFailed("interrupted")
    return read, code


def _cancel_on(proc: subprocess.Popen[str], cancel: threading.Event) -> None:
    while proc.poll() is None:
        if cancel.wait(0.2):
            _stop(proc)
            return


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGINT (buildx cancels the solve), then SIGKILL."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=CANCEL_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _build_error(errors: list[str], code: int) -> str:
    lines = [e.strip() for e in errors if e.strip()]
    main = next((e for e in reversed(lines) if e.startswith("ERROR") or "error" in e.lower()), lines[-1] if lines
                else f"docker buildx build exited {code}")
    text = " ".join(main.split())[:400]
    if "exit code: 137" in text:
        text += " (the step was killed, usually out of memory: give the engine more memory or use fewer --jobs)"
    return text
