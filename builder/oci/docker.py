"""The container engine behind one interface: :class:`Engine` (a Protocol: every request the builder
makes of an engine), :class:`DockerEngine` (Docker, through docker-py and ``docker buildx``),
:class:`PodmanEngine` (podman, through docker-py on its Docker-compatible API and the podman CLI), and
:func:`connect`, which finds one (``--engine``/``BUILDER_ENGINE``, else docker, then podman) or says in
one line how to get one.

Example:
    >>> engine_version("26.1.5+dfsg1")
    (26, 1)
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import dataclasses
import functools
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import docker
import requests
from docker.errors import DockerException
from urllib3.exceptions import ReadTimeoutError

from builder.config.errors import TargetFailed, UserError
from builder.oci import artifacts, buildah, buildkit, registry
from builder.oci.secrets import ENGINE, PLAIN, PODMAN, child_env

#: Builds stream for minutes; the default 60 s read timeout would cut them off.
TIMEOUT_S = 3600


def engine_address() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


#: The oldest engine builds are tested on: BuildKit with named contexts and zstd, both image stores.
MIN_ENGINE = (26, 0)


#: The engines builder drives, in the order it tries them when none is chosen (RamaLama's order, reversed:
#: docker first, as the existing hosts and CI have it).
ENGINES = ("docker", "podman")
#: The environment variable that chooses one (``--engine`` sets it for the command).
ENGINE_VAR = "BUILDER_ENGINE"
#: The oldest podman builds are tested on (Debian 12's): ``--build-context``, ``RUN --mount=from=``.
MIN_PODMAN = (4, 3)


#: The engine :func:`connect` found last, for messages (:func:`engine_label`); Docker's until then.
_connected: dict[str, str] = {}


def engine_label() -> tuple[str, str]:
    """How a message names the engine in use, and the command that checks it.

    Example:
        >>> engine_label()[1]
        'docker info'
    """
    if _connected.get("name") == "podman":
        return f"podman at {_connected['address']}", "podman info"
    return f"Docker engine at {engine_address()}", "docker info"


def chosen_engine() -> str | None:
    """``docker`` or ``podman`` when BUILDER_ENGINE (or ``--engine``) names one; None: whichever answers."""
    value = os.environ.get(ENGINE_VAR, "").strip().lower()
    if value and value not in ENGINES:
        raise UserError(f"{ENGINE_VAR}={value!r} names no engine; use one of: {', '.join(ENGINES)}")
    return value or None


def connect(timeout: int = TIMEOUT_S, kind: str | None = None) -> Engine:
    """The engine *kind* (default: the chosen one, BUILDER_ENGINE), else Docker if it answers (only Docker when
    DOCKER_HOST is set), else podman if installed; checked for its version; else one UserError that says how to
    get one.

    Example:
        >>> connect().version()["Version"]  # doctest: +SKIP
        '26.1.5+dfsg1'
    """
    kind = kind or chosen_engine()
    if kind == "podman":
        return connect_podman(timeout)
    if kind == "docker" or _docker_only():
        return connect_docker(timeout)
    try:
        return connect_docker(timeout)
    except UserError as no_docker:
        try:
            return connect_podman(timeout)
        except UserError as no_podman:
            raise UserError(f"{no_docker}; and podman: {no_podman}") from None


def _docker_only() -> bool:
    """Whether Docker is the engine when none is chosen, without asking it: no podman, or a DOCKER_HOST the user
    set (it names the engine: when it does not answer, say so rather than run on another engine behind their
    back; podman's own CONTAINER_HOST is read once podman is chosen)."""
    return shutil.which("podman") is None or bool(os.environ.get("DOCKER_HOST"))


def engine_kind(timeout: int = 15) -> str:
    """The engine :func:`connect` would give, by name: the chosen one, else ``docker`` where it is the only
    candidate or answers, else ``podman``. ``builder run`` plans for it (its device flags, its command line)
    before it connects; Docker is asked only where neither is chosen and both are installed.

    Example:
        >>> engine_kind()  # doctest: +SKIP
        'docker'
    """
    kind = chosen_engine()
    if kind:
        return kind
    if _docker_only():
        return "docker"
    try:
        connect_docker(timeout).close()
    except UserError:
        return "podman"
    return "docker"


def connect_docker(timeout: int = TIMEOUT_S) -> DockerEngine:
    """Docker at DOCKER_HOST, answering and 26 or newer; else one UserError that says how to get one."""
    try:
        engine = DockerEngine.from_env(timeout)
        version = str(engine.version().get("Version", ""))
    except DockerException as exc:
        reason = str(exc).splitlines()[0][:160]
        raise UserError(
            f"no Docker engine answers at {engine_address()} ({reason}); start one "
            "(systemctl start docker, or dockerd &) or point DOCKER_HOST at a running engine"
        ) from None
    if engine_version(version) < MIN_ENGINE:
        raise UserError(f"the engine at {engine_address()} is Docker {version}; builder needs Docker >= "
                        f"{'.'.join(map(str, MIN_ENGINE))} (BuildKit with named contexts, zstd, the containerd "
                        "image store): upgrade it (scripts/setup-host.sh prints how)")
    _connected.update(name="docker")
    return engine


def connect_podman(timeout: int = TIMEOUT_S) -> PodmanEngine:
    """podman 4.3 or newer, its API at CONTAINER_HOST, its own socket, or a service of ours; else one UserError."""
    if shutil.which("podman") is None:
        raise UserError("podman is not installed: apt-get install podman buildah (or: make host ENGINE=podman)")
    try:
        engine = PodmanEngine.from_env(timeout)
        version = str(engine.version().get("Version", ""))
    except (DockerException, OSError, subprocess.SubprocessError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise UserError(f"podman's API does not answer ({reason}); check 'podman info', or start it: "
                        "podman system service --time=0 and point CONTAINER_HOST at it") from None
    if engine_version(version) < MIN_PODMAN:
        engine.close()
        raise UserError(f"podman {version} is too old; builder needs podman >= {'.'.join(map(str, MIN_PODMAN))} "
                        "(--build-context, RUN --mount=type=bind,from=): upgrade it")
    _connected.update(name="podman", address=engine.address())
    return engine


def engine_version(version: str) -> tuple[int, int]:
    """``26.1.5+dfsg1`` -> (26, 1); unparsable -> (0, 0).

    Example:
        >>> engine_version("26.1.5+dfsg1")
        (26, 1)
    """
    parts = re.findall(r"\d+", version)[:2]
    return (int(parts[0]), int(parts[1]) if len(parts) > 1 else 0) if parts else (0, 0)


def image_store(info: dict[str, Any]) -> str:
    """``containerd`` or ``classic``: which image store the engine keeps images in, from its ``info()``."""
    status = info.get("DriverStatus") or []
    return "containerd" if any(pair[:2] == ["driver-type", "io.containerd.snapshotter.v1"] for pair in status) \
        else "classic"


class EngineError(Exception):
    """The engine refused a request; the text is the engine's own explanation (one line)."""


class ContainerTimeout(EngineError):
    """A container still ran when its time was up (it was removed)."""


class Engine(Protocol):
    """Every request the builder makes of a container engine, in one place (repo2docker's
    ``ContainerEngine``, RamaLama's engine: the model). :class:`DockerEngine` is the docker-py
    implementation; a second engine (podman) implements the same methods. Callers take an
    ``Engine`` and never a client of one engine; the unit tests' stand-ins are checked against
    this Protocol by mypy.

    Images are named as the engine names them (``repo:tag``, ``repo@sha256:...`` or an ID);
    requests the engine refuses raise :class:`EngineError` with its words, and an engine that does
    not answer raises what its client raises (:mod:`builder.oci.faults` says it in one line).
    """

    def name(self) -> str:
        """Which engine: ``docker`` or ``podman`` (:data:`ENGINES`), for messages and ``builder doctor``."""
        ...

    def address(self) -> str:
        """Where the engine listens (``unix:///var/run/docker.sock``), for messages."""
        ...

    def version(self) -> dict[str, Any]:
        """The engine's ``version`` (``Version``, ``ApiVersion``, ...)."""
        ...

    def info(self) -> dict[str, Any]:
        """The engine's ``info`` (runtimes, CDI spec folders, the storage driver, ...)."""
        ...

    def store(self) -> str:
        """``containerd`` or ``classic``: the image store (:func:`image_store`)."""
        ...

    def image(self, ref: str) -> dict[str, Any] | None:
        """The engine's ``inspect`` of an image, or None when it has no image of that name."""
        ...

    def resolve(self, names: Sequence[str]) -> str:
        """The engine's ID of an image a build named by several digests: the containerd store names an image
        by its manifest digest, the classic store by its config digest; the first one the engine knows."""
        ...

    def tag(self, image: str, ref: str) -> None:
        """Point *ref* (``repo:tag``) at *image*, moving it from whatever it named."""
        ...

    def size(self, image: str) -> int:
        """The image's unpacked size in bytes (:func:`image_size`)."""
        ...

    def labels(self, image: str) -> dict[str, str]:
        """The labels of the image's config."""
        ...

    def repo_digests(self, ref: str) -> list[str]:
        """``repo@sha256:...`` of every registry the engine pushed the image to or pulled it from."""
        ...

    def pull(self, ref: str, creds: dict[str, str] | None = None, *, platform: str | None = None) -> None:
        """Pull *ref* (``repo:tag`` or ``repo@sha256:...``), of *platform* when given."""
        ...

    def push(self, ref: str, compression: str = "gzip") -> str:
        """Push one tag; return the manifest digest the registry reports for it, checked against the engine's.
        *compression* is the target's: an engine that compresses at push (podman) uses it; one whose build
        compressed the layers already (BuildKit's exporter) pushes them as they are."""
        ...

    def save(self, ref: str) -> Iterator[bytes]:
        """The image as a docker-archive (``docker save``), in chunks."""
        ...

    def load(self, archive: Path) -> None:
        """Load a docker-archive; a load the engine refuses raises :class:`EngineError`."""
        ...

    def remove_image(self, ref: str) -> str | None:
        """Remove an image (or this one of its tags); None when it is gone, else why it was kept."""
        ...

    def disk_usage(self) -> dict[str, Any]:
        """The engine's ``system df``: ``Images`` and ``BuildCache`` records with their sizes."""
        ...

    def build_cache(self) -> list[dict[str, Any]]:
        """The build-cache records of :meth:`disk_usage` alone (``ID``, ``Type``, ``Description``,
        ``LastUsedAt``, ``UsageCount``, ``InUse``...), without measuring images: what a build reads
        before and after itself."""
        ...

    def prune_build_cache(self, record: str) -> str | None:
        """Remove one build-cache record by ID; None when done, else why not."""
        ...

    def build(
        self,
        request: buildkit.BuildRequest,
        *,
        on_step: Callable[[int, int, str], None] = ...,
        on_log: Callable[[str], None] = ...,
        cancel: threading.Event | None = None,
        registry_host: str | None = None,
        cwd: Path | None = None,
    ) -> tuple[str, buildkit.BuildResult]:
        """Run one build; return the engine's ID of the image it made, and the result."""
        ...

    def run(self, image: str, command: Sequence[str], *, labels: Mapping[str, str], timeout: int,
            **options: Any) -> tuple[int, str, str]:
        """Run a container to completion; return (exit status, stdout and stderr merged, stdout). Always
        removes it; still running after *timeout* seconds raises :class:`ContainerTimeout`. *options* are
        the container's settings (``network_mode``, ``devices``, ``device_requests``, ``environment``,
        ``tmpfs``, ``shm_size``: the engine API's names)."""
        ...

    def create(self, options: Mapping[str, Any]) -> str:
        """Create a container (the engine API's settings, ``image`` and ``command`` among them); return its ID."""
        ...

    def attach(self, container: str) -> Iterator[tuple[bytes | None, bytes | None]]:
        """(stdout, stderr) chunks of a created container, from its first byte (attach before start)."""
        ...

    def start(self, container: str) -> None:
        """Start a created container."""
        ...

    def wait(self, container: str) -> int:
        """Wait for the container to exit; its exit status."""
        ...

    def stop(self, container: str, timeout: int) -> None:
        """Stop it (TERM, then KILL after *timeout* seconds); one gone already is no error."""
        ...

    def containers(self, label: str) -> list[str]:
        """The IDs of every container, running or not, carrying *label* (``key=value``)."""
        ...

    def container_labels(self, label: str) -> dict[str, dict[str, str]]:
        """{ID: its labels} of every container, running or not, carrying *label* (``key`` or ``key=value``)."""
        ...

    def remove_container(self, container: str) -> None:
        """Force-remove a container; one gone already, or being removed, is no error."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


def _explanation(exc: docker.errors.DockerException) -> str:
    """The engine's own words for a refused request, not docker-py's request URL."""
    text = exc.explanation if isinstance(exc, docker.errors.APIError) and exc.explanation else str(exc)
    return (str(text).strip().splitlines() or ["?"])[0][:300]


class DockerEngine:
    """:class:`Engine` over the Docker Engine API (docker-py) and BuildKit (``docker buildx``): with
    :class:`PodmanEngine`, its subclass, the only place that holds a ``docker.DockerClient``.

    Example:
        >>> connect().image("localhost:5000/ml-runtime:cpu")["Id"]  # doctest: +SKIP
        'sha256:...'
    """

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client

    @classmethod
    def from_env(cls, timeout: int = TIMEOUT_S) -> DockerEngine:
        """The engine DOCKER_HOST names (else the local socket), unchecked: its first request may fail."""
        return cls(docker.from_env(timeout=timeout))

    def name(self) -> str:
        return "docker"

    def address(self) -> str:
        return engine_address()

    def version(self) -> dict[str, Any]:
        return dict(self.client.version())

    def info(self) -> dict[str, Any]:
        return dict(self.client.info())

    def store(self) -> str:
        return image_store(self.info())

    def image(self, ref: str) -> dict[str, Any] | None:
        try:
            return dict(self.client.api.inspect_image(ref))
        except docker.errors.ImageNotFound:
            return None

    def resolve(self, names: Sequence[str]) -> str:
        for name in names:
            found = self.image(name)
            if found is not None:
                return str(found["Id"])
        raise UserError(f"the engine knows none of {', '.join(names)}, which the build just made; "
                        "is DOCKER_HOST the engine buildx builds on? (select the builder with --builder)")

    def tag(self, image: str, ref: str) -> None:
        repo, tag = ref.rsplit(":", 1)
        self.client.api.tag(image, repo, tag, force=True)

    def size(self, image: str) -> int:
        try:
            return sum(int(entry.get("Size") or 0) for entry in self.client.api.history(image))
        except docker.errors.NotFound:
            # Docker 26's containerd store has no history of a foreign platform's image ("snapshot ... does
            # not exist"): its own Size, the compressed content, is the figure it has.
            return int(self.client.api.inspect_image(image).get("Size") or 0)

    def labels(self, image: str) -> dict[str, str]:
        return dict(self.client.api.inspect_image(image)["Config"].get("Labels") or {})

    def repo_digests(self, ref: str) -> list[str]:
        found = self.image(ref)
        return list((found or {}).get("RepoDigests") or [])

    def pull(self, ref: str, creds: dict[str, str] | None = None, *, platform: str | None = None) -> None:
        try:  # docker-py splits the tag or digest off the reference itself
            self.client.api.pull(ref, platform=platform, auth_config=creds)
        except docker.errors.APIError as exc:
            raise EngineError(_explanation(exc)) from None

    def push(self, ref: str, compression: str = "gzip") -> str:
        r = registry.Ref.parse(ref)
        creds = registry.credentials(r.host)
        digest = None
        try:
            for event in self.client.api.push(r.name, tag=r.tag, auth_config=creds, stream=True, decode=True):
                if "error" in event:
                    raise TargetFailed(_explain(r.host, event["error"]))
                digest = (event.get("aux") or {}).get("Digest", digest)
        except docker.errors.APIError as exc:
            raise TargetFailed(_explain(r.host, exc.explanation or str(exc))) from None
        except docker.errors.DockerException as exc:
            raise TargetFailed(f"push of {ref} failed: {exc}") from None
        reported = registry.manifest_digest(ref, creds)
        if digest is None:  # the containerd image store reports none: the local image's names say it
            digest = reported if reported and f"{r.name}@{reported}" in self.repo_digests(ref) else None
            if digest is None:
                raise TargetFailed(f"push of {ref}: the registry has {reported}, which the engine does not know "
                                   "as this image (another push to the same tag?); push again")
        if reported != digest:
            raise TargetFailed(f"push of {ref}: registry reports {reported}, the engine pushed {digest}")
        return digest

    def save(self, ref: str) -> Iterator[bytes]:
        yield from self.client.api.get_image(ref)

    def load(self, archive: Path) -> None:
        # docker-py's load_image is a generator: a failed load is an error event in it (or an API error
        # when the engine refuses the request), so it is read to the end here, never left unread.
        try:
            with archive.open("rb") as handle:
                for event in self.client.api.load_image(handle):
                    if "error" in event:
                        raise EngineError(str(event["error"]).strip()[:300])
        except docker.errors.APIError as exc:
            raise EngineError(_explanation(exc)) from None

    def remove_image(self, ref: str) -> str | None:
        try:
            self.client.api.remove_image(ref)
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError as exc:  # a container uses it (conflict): kept
            return _explanation(exc)[:200]
        return None

    def disk_usage(self) -> dict[str, Any]:
        return dict(self.client.api.df())

    def build_cache(self) -> list[dict[str, Any]]:
        api = self.client.api  # API 1.42+: ?type= measures that kind alone (docker-py's df() takes no type)
        answer = api._result(api._get(api._url("/system/df"), params={"type": "build-cache"}), json=True)
        return list(answer.get("BuildCache") or [])

    def prune_build_cache(self, record: str) -> str | None:
        # buildx 0.13's filters are ANDed and know no regular expression (~=): one record a call.
        proc = subprocess.run(["docker", "buildx", "prune", "--force", "--filter", f"id={record}"],
                              capture_output=True, text=True, check=False, env=child_env(ENGINE))
        return proc.stderr.strip()[-300:] if proc.returncode != 0 else None

    def build(
        self,
        request: buildkit.BuildRequest,
        *,
        on_step: Callable[[int, int, str], None] = lambda n, total, text: None,
        on_log: Callable[[str], None] = lambda line: None,
        cancel: threading.Event | None = None,
        registry_host: str | None = None,
        cwd: Path | None = None,
    ) -> tuple[str, buildkit.BuildResult]:
        """BuildKit reads the base and the cache from *registry_host* itself, with the same credentials."""
        creds = registry.credentials(registry_host) if registry_host else None
        result = buildkit.run(request, on_step=on_step, on_log=on_log, cancel=cancel, registry_host=registry_host,
                              creds=creds, cwd=cwd)
        return self.resolve(result.ids), result

    def run(self, image: str, command: Sequence[str], *, labels: Mapping[str, str], timeout: int,
            **options: Any) -> tuple[int, str, str]:
        return self._run_to_end(self.client.containers.create(image, list(command), labels=dict(labels), **options),
                                timeout)

    def _run_to_end(self, container: Any, timeout: int) -> tuple[int, str, str]:
        """Start the docker-py *container*, wait for it, read its output, remove it (see :meth:`run`)."""
        try:
            container.start()
            try:
                status = int(container.wait(timeout=timeout)["StatusCode"])
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError) as exc:
                # ReadTimeout before the engine's headers, ConnectionError(ReadTimeoutError) after them
                if not isinstance(exc, requests.exceptions.ReadTimeout) and not (
                        exc.args and isinstance(exc.args[0], ReadTimeoutError)):
                    raise
                raise ContainerTimeout(f"still running after the {timeout} s timeout") from None
            merged = container.logs(stdout=True, stderr=True).decode(errors="replace")
            return status, merged, container.logs(stdout=True, stderr=False).decode(errors="replace")
        finally:
            container.remove(force=True)

    def create(self, options: Mapping[str, Any]) -> str:
        try:
            return str(self.client.containers.create(**options).id)
        except docker.errors.APIError as exc:
            raise EngineError(_explanation(exc)) from None

    def attach(self, container: str) -> Iterator[tuple[bytes | None, bytes | None]]:
        # logs=True as well: not a byte written before the attach is lost.
        stream = self.client.api.attach(container, stdout=True, stderr=True, stream=True, logs=True, demux=True)
        return iter(stream)

    def start(self, container: str) -> None:
        try:
            self.client.api.start(container)
        except docker.errors.APIError as exc:
            raise EngineError(_explanation(exc)) from None

    def wait(self, container: str) -> int:
        return int(self.client.api.wait(container)["StatusCode"])

    def stop(self, container: str, timeout: int) -> None:
        try:
            self.client.api.stop(container, timeout=timeout)
        except docker.errors.APIError:  # gone already (NotFound is an APIError)
            pass

    def containers(self, label: str) -> list[str]:
        return [c["Id"] for c in self.client.api.containers(all=True, filters={"label": label})]

    def container_labels(self, label: str) -> dict[str, dict[str, str]]:
        return {c["Id"]: c.get("Labels") or {} for c in self.client.api.containers(all=True, filters={"label": label})}

    def remove_container(self, container: str) -> None:
        try:
            self.client.api.remove_container(container, force=True)
        except docker.errors.APIError:
            pass

    def close(self) -> None:
        self.client.close()


#: prctl(PR_SET_PDEATHSIG): the podman service we start ends with the process that started it.
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def podman_socket() -> str | None:
    """podman's API where one listens already: CONTAINER_HOST (podman's own variable), else the socket
    ``podman.socket`` (systemd) serves, root's or the user's; None when none is there."""
    if host := os.environ.get("CONTAINER_HOST"):
        return host
    runtime = "/run" if os.geteuid() == 0 else os.environ.get("XDG_RUNTIME_DIR", f"/run/user/{os.getuid()}")
    path = Path(runtime) / "podman" / "podman.sock"
    return f"unix://{path}" if path.is_socket() else None


#: The podman releases from which builds and pushes use what they lack before (see :func:`podman_lacks`).
PODMAN_PER_RUN_NETWORK, PODMAN_FORCE_COMPRESSION, PODMAN_LAYER_CACHE = (4, 5), (4, 7), (5, 0)


def podman_lacks(version: str) -> list[str]:
    """What this podman does not do that builds with docker do (``builder doctor`` lists it).

    Example:
        >>> podman_lacks("4.3.1")[0]
        'per-RUN --network (podman 4.5): the whole build runs with --network=none'
    """
    found = engine_version(version)
    lacks = []
    if found < PODMAN_PER_RUN_NETWORK:
        lacks.append("per-RUN --network (podman 4.5): the whole build runs with --network=none")
    if found < PODMAN_FORCE_COMPRESSION:
        lacks.append("push --force-compression (podman 4.7): a layer the registry holds in another compression "
                     "(the base's) is recompressed by builder after the push")
    if found < PODMAN_LAYER_CACHE:
        lacks.append("a layer cache that mounts cached stages (podman 5): a changed target builds whole (--no-cache)")
    lacks.append("BuildKit's registry cache (--cache-from/--cache-to type=registry): content tags still reuse images")
    return lacks


class PodmanEngine(DockerEngine):
    """:class:`Engine` over podman: docker-py on podman's Docker-compatible API (``podman system service``)
    for what that API answers as Docker does (inspect, tag, containers, save/load, df: the Protocol speaks
    the Docker API's names, so those requests are the same), and the podman CLI for what it does not:
    builds (buildah, :mod:`builder.oci.buildah`), pushes (compression is chosen at push) and pulls from
    plain-http loopback registries (``--tls-verify=false``).

    Where no API listens (no systemd socket, no CONTAINER_HOST), it starts ``podman system service`` on
    a private socket for its own lifetime: stopped by :meth:`close`, at exit, or with this process.
    """

    def __init__(self, client: docker.DockerClient, url: str, service: subprocess.Popen[bytes] | None = None,
                 folder: str | None = None) -> None:
        super().__init__(client)
        self.url, self.service, self.folder = url, service, folder
        #: {image ID: repo@digest pushed}: podman's RepoDigests name the local manifest only, never the one a
        #: push wrote (it compresses at push), so what its --digestfile said is kept here
        self.pushed: dict[str, set[str]] = {}
        if service is not None:
            atexit.register(self.close)

    @classmethod
    def from_env(cls, timeout: int = TIMEOUT_S) -> PodmanEngine:
        if (url := podman_socket()) is not None:
            return cls(docker.DockerClient(base_url=url, timeout=timeout), url)
        folder = tempfile.mkdtemp(prefix="builder-podman-api-")
        url = f"unix://{folder}/podman.sock"
        service = subprocess.Popen(["podman", "system", "service", "--time=0", url], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                                   env=child_env(PODMAN), preexec_fn=_die_with_parent)  # noqa: PLW1509 - prctl only, no locks taken
        deadline = time.monotonic() + 30
        while not Path(folder, "podman.sock").is_socket():
            if service.poll() is not None or time.monotonic() > deadline:
                error = (service.stderr.read().decode(errors="replace") if service.poll() is not None
                         and service.stderr else "no socket after 30 s").strip().splitlines() or ["?"]
                service.kill()
                service.wait()
                shutil.rmtree(folder, ignore_errors=True)
                raise OSError(f"podman system service: {error[-1][:200]}")
            time.sleep(0.1)
        return cls(docker.DockerClient(base_url=url, timeout=timeout), url, service, folder)

    def name(self) -> str:
        return "podman"

    def address(self) -> str:
        return self.url

    def run(self, image: str, command: Sequence[str], *, labels: Mapping[str, str], timeout: int,
            **options: Any) -> tuple[int, str, str]:
        created = self.create({"image": image, "command": list(command), "labels": dict(labels), **options})
        return self._run_to_end(self.client.containers.get(created), timeout)

    def create(self, options: Mapping[str, Any]) -> str:
        """A container of docker-py *options*: by the compatible API where it does what Docker does, else by
        the CLI (the API attaches, starts and waits as for any). The CLI where the API would do otherwise:

        - a CDI device: the API drops a device request of driver "cdi" without a word (4.3.1: the container
          starts without the device), and a CDI name as a device path fails its stat; the CLI reads specs;
        - a variable to unset (a bare name in a list ``environment``, as Docker's API takes it): the API
          keeps the image's value (the emulated smoke test's TINI_SUBREAPER, fatal under qemu); the CLI
          has ``--unsetenv``;
        - rootless, the user's own UID as ``user`` (``builder run``): it is the same inside only with
          ``--userns keep-id``, which docker-py refuses to send; else it is a subordinate ID and
          /workspace, the user's, is not writable.

        A GPU request other than a CDI name (docker's ``--gpus``) is refused on either path: the API takes it and
        starts the container without the GPUs (4.3.1, tried), the CLI has no form for it.
        """
        _podman_gpus(options.get("device_requests") or [])
        environment = options.get("environment")
        unset = isinstance(environment, list) and any("=" not in entry for entry in environment)
        own = own_user(options) and self.rootless()
        if not (_cdi_names(options) or unset or own):
            return super().create(_api_options(options))
        argv = [*(["--userns", "keep-id"] if own else []), *_create_argv(options)]
        return self._cli(["create", *argv], "podman create").stdout.strip().splitlines()[-1]

    @functools.cache  # noqa: B019 - one engine a run, and its release does not change under it
    def release(self) -> tuple[int, int]:
        """This podman's (major, minor), asked once: builds and pushes branch on it."""
        return engine_version(str(self.version().get("Version", "")))

    def forces_compression(self) -> bool:
        """Whether this podman's push takes ``--force-compression`` (4.7): every layer in the asked one."""
        return self.release() >= PODMAN_FORCE_COMPRESSION

    @functools.cache  # noqa: B019 - one engine a run; its mode does not change under it
    def rootless(self) -> bool:
        """Whether this podman runs without root (user namespaces, subuid/subgid), asked once."""
        # podman's own info (the libpod API beside the compatible one): the compatible info does not say it
        answer = self.client.api._get(self.client.api._url("/libpod/info"))
        answer.raise_for_status()
        return bool(answer.json().get("host", {}).get("security", {}).get("rootless"))

    def _cli(self, argv: list[str], what: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["podman", *argv], capture_output=True, text=True, check=False, env=child_env(PODMAN))
        if proc.returncode != 0:
            raise EngineError(f"{what}: {(proc.stderr.strip().splitlines() or ['?'])[-1][:300]}")
        return proc

    def pull(self, ref: str, creds: dict[str, str] | None = None, *, platform: str | None = None) -> None:
        host = registry.Ref.parse(ref).host
        with _authfile(host, creds) as authfile:
            self._cli(["pull", "--quiet", *(["--platform", platform] if platform else []),
                       *(["--authfile", authfile] if authfile else []), *_tls(host), ref], f"pull of {ref}")

    def push(self, ref: str, compression: str = "gzip") -> str:
        r = registry.Ref.parse(ref)
        creds = registry.credentials(r.host)
        with tempfile.TemporaryDirectory(prefix="builder-push-") as tmp, _authfile(r.host, creds) as authfile:
            digestfile = Path(tmp) / "digest"
            # zstd needs OCI media types (Docker's has no zstd type); gzip keeps Docker's, as buildx's exporter
            manifest = "oci" if compression == "zstd" else "v2s2"
            proc = subprocess.run(
                ["podman", "push", "--quiet", "--format", manifest, "--compression-format", compression,
                 *(["--force-compression"] if self.forces_compression() else []), "--digestfile", str(digestfile), *(["--authfile", authfile] if authfile else []), *_tls(r.host), ref],
                capture_output=True, text=True, check=False, env=child_env(PODMAN))
            if proc.returncode != 0:
                raise TargetFailed(_explain(r.host, proc.stderr.strip().splitlines()[-1] if proc.stderr.strip()
                                            else f"podman push exited {proc.returncode}"))
            digest = digestfile.read_text().strip() if digestfile.exists() else None
        reported = registry.manifest_digest(ref, creds)
        if digest is None or reported != digest:
            raise TargetFailed(f"push of {ref}: registry reports {reported}, podman pushed {digest}")
        # podman < 4.7 has no --force-compression: a layer the registry holds already (the base's, pushed as
        # gzip) is reused in its compression. A mixed image breaks enroot 4.0-4.1.2 (the first layer's type
        # applies to all) and a zstd layer every puller before Docker 23: recompress those layers here.
        digest = recompress(ref, compression, creds) or digest
        if (found := self.image(ref)) is not None:
            self.pushed.setdefault(str(found["Id"]), set()).add(f"{r.name}@{digest}")
        return digest

    def repo_digests(self, ref: str) -> list[str]:
        found = self.image(ref)
        if found is None:
            return []
        return sorted({*(found.get("RepoDigests") or []), *self.pushed.get(str(found["Id"]), ())})

    def disk_usage(self) -> dict[str, Any]:
        usage = super().disk_usage()
        # podman 4.3's compatible df lists an image once per tag, by the tag alone and without labels; its
        # images list names them as Docker's df does: that, with df's sizes and container counts
        found = {str(i.get("Id", "")).removeprefix("sha256:"): i for i in usage.get("Images") or []}
        images = []
        for image in self.client.api.images(all=True):
            sizes = found.get(str(image["Id"]).removeprefix("sha256:"), {})
            images.append({**image, **{key: int(sizes.get(key) or 0) for key in ("Containers", "Size", "SharedSize")}})
        return {**usage, "Images": images}

    def build_cache(self) -> list[dict[str, Any]]:
        return []  # buildah's cache is its images (see prune_build_cache)

    def prune_build_cache(self, record: str) -> str | None:
        return "podman keeps no build cache apart from its images (builder gc removes those)"

    def build(
        self,
        request: buildkit.BuildRequest,
        *,
        on_step: Callable[[int, int, str], None] = lambda n, total, text: None,
        on_log: Callable[[str], None] = lambda line: None,
        cancel: threading.Event | None = None,
        registry_host: str | None = None,
        cwd: Path | None = None,
    ) -> tuple[str, buildkit.BuildResult]:
        """buildah pulls the base from *registry_host* itself (when it is not local), with the same credentials."""
        creds = registry.credentials(registry_host) if registry_host else None
        per_run_network = self.release() >= PODMAN_PER_RUN_NETWORK
        if self.release() < PODMAN_LAYER_CACHE and not request.no_cache:
            # buildah 1.28 (podman 4.3) mounts nothing for `RUN --mount=from=<stage>` when that stage came
            # whole from its layer cache ("couldn't find .../merged/opt/uv on host to bind mount"): the
            # second build of a changed target failed. Build without the cache there; an unchanged target
            # is still a no-op (its content tag). podman 5.4.2 (buildah 1.39.3) builds a changed target with the
            # cache on (run in a Debian 13 container); between 4.3 and 5.4 is untried, so 5.0 is the cut.
            request = dataclasses.replace(request, no_cache=True)
        with _authfile(registry_host, creds) as authfile:
            result = buildah.run(request, per_run_network=per_run_network, on_step=on_step, on_log=on_log,
                                 cancel=cancel, authfile=authfile, tls_verify=not (registry_host and registry.is_local(registry_host)),
                                 cwd=cwd)
        return self.resolve(result.ids), result

    def close(self) -> None:
        super().close()
        service, self.service = self.service, None
        if service is not None:
            service.terminate()
            try:
                service.wait(timeout=10)
            except subprocess.TimeoutExpired:
                service.kill()
                service.wait()
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)


def _api_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """docker-py container *options* as podman's compatible API must get them to do what Docker does.

    - A tmpfs is empty, as Docker mounts one: podman copies what is at the path onto its tmpfs
      (``tmpcopyup``, its default), and a copy of sysfs fails (``tmpcopyup: failed to copy
      /sys/devices/system/cpu``: the smoke test's mask under emulation). ``notmpcopyup`` unless asked.
    - No network named: podman's own default for its mode (``private``: rootful a bridge, rootless
      slirp4netns, pasta from podman 5), as its CLI does. The API would take Docker's ``bridge``, which a
      rootless podman 4.3 cannot set up without a rootless network namespace (``failed to mount runtime
      directory for rootless netns``), so ``builder run`` did not start rootless.

    Example:
        >>> _api_options({"tmpfs": {"/sys/devices/system/cpu": "ro", "/a": ""}, "user": "1001"})
        {'tmpfs': {'/sys/devices/system/cpu': 'ro,notmpcopyup', '/a': 'notmpcopyup'}, 'user': '1001', 'network_mode': 'private'}
        >>> _api_options({"network_mode": "none"})
        {'network_mode': 'none'}
    """
    out = {**options, "network_mode": options.get("network_mode") or "private"}
    if tmpfs := options.get("tmpfs"):
        out["tmpfs"] = _empty_tmpfs(tmpfs)
    return out


def _empty_tmpfs(tmpfs: Mapping[str, str]) -> dict[str, str]:
    """Each tmpfs's options with ``notmpcopyup`` (see :func:`_api_options`), unless they say otherwise."""
    return {path: how if "tmpcopyup" in how else ",".join(filter(None, [how, "notmpcopyup"]))
            for path, how in tmpfs.items()}


def _cdi_names(options: Mapping[str, Any]) -> list[str]:
    """The CDI device names among docker-py *options*' device requests (driver ``cdi``)."""
    return [name for request in options.get("device_requests") or [] if request.get("Driver") == "cdi"
            for name in request.get("DeviceIDs") or []]


def own_user(options: Mapping[str, Any]) -> bool:
    """Whether the container runs as this process's UID:GID (``builder run --user auto``): rootless podman keeps it
    the same inside only with ``--userns keep-id``."""
    return str(options.get("user") or "") == f"{os.getuid()}:{os.getgid()}"


def _podman_gpus(requests: Sequence[Mapping[str, Any]]) -> list[str]:
    """CDI requests as ``--device`` names; any other (docker's ``--gpus``: a no-op before podman 5) has no podman
    form."""
    if any(request.get("Driver") != "cdi" for request in requests):
        raise EngineError("podman names GPUs by CDI only: a device request other than a CDI name (docker's "
                          "--gpus) has no podman form; make a CDI spec: nvidia-ctk cdi generate "
                          "--output=/var/run/cdi/nvidia.yaml")
    return [arg for name in _cdi_names({"device_requests": requests}) for arg in ("--device", name)]


def _docker_gpus(requests: Sequence[Mapping[str, Any]]) -> list[str]:
    """``docker run``'s forms: ``--gpus all`` for every GPU (the NVIDIA runtime's request), ``--device`` a CDI name."""
    argv = []
    for request in requests:
        if request.get("Driver") == "cdi":
            argv += [arg for name in request.get("DeviceIDs") or [] for arg in ("--device", name)]
        elif request.get("Count") == -1 and not request.get("DeviceIDs") and request.get("Capabilities") == [["gpu"]]:
            argv += ["--gpus", "all"]
        else:
            raise EngineError(f"docker run: the device request {dict(request)} has no --gpus form in builder")
    return argv


def _device(value: str) -> str:
    """A device as docker-py gives it (``/dev/kfd:/dev/kfd:rwm``) as the CLIs take it: the path alone where it is
    the same inside, with every permission (the CLIs' default)."""
    path, _, rest = str(value).partition(":")
    return path if rest in ("", f"{path}:rwm") else str(value)


def _docker_env(value: Mapping[str, str] | Sequence[str]) -> list[str]:
    entries = list(value) if not isinstance(value, Mapping) else [f"{k}={v}" for k, v in value.items()]
    if bare := [entry for entry in entries if "=" not in entry]:
        raise EngineError(f"docker run: no form to unset {', '.join(bare)} (docker run -e NAME passes the host's)")
    return [arg for entry in entries for arg in ("--env", entry)]


#: docker-py ``containers.create`` options (those builder gives) as ``podman create``/``podman run`` arguments.
_CREATE_FLAGS: dict[str, Callable[[Any], list[str]]] = {
    "environment": lambda value: [a for entry in (value if isinstance(value, list) else
                                                  [f"{k}={v}" for k, v in value.items()])
                                  for a in (("--env", entry) if "=" in entry else ("--unsetenv", entry))],
    "tmpfs": lambda value: [a for path, how in _empty_tmpfs(value).items() for a in ("--tmpfs", f"{path}:{how}")],
    "network_mode": lambda value: ["--network", str(value)],
    "entrypoint": lambda value: ["--entrypoint", json.dumps(list(value)) if isinstance(value, list) else str(value)],
    "labels": lambda value: [a for k, v in value.items() for a in ("--label", f"{k}={v}")],
    "device_requests": _podman_gpus,
    "devices": lambda value: [a for v in value for a in ("--device", _device(v))],
    "group_add": lambda value: [a for v in value for a in ("--group-add", str(v))],
    "security_opt": lambda value: [a for v in value for a in ("--security-opt", str(v))],
    "ipc_mode": lambda value: ["--ipc", str(value)],
    "shm_size": lambda value: ["--shm-size", str(value)],
    "user": lambda value: ["--user", str(value)],
    "mounts": lambda value: [a for m in value for a in (
        "--mount", f"type={m['Type']},source={m['Source']},target={m['Target']}{',ro' if m.get('ReadOnly') else ''}")],
    "working_dir": lambda value: ["--workdir", str(value)],
}
#: The same as ``docker run`` arguments (``builder run --dry-run`` on Docker; builder itself runs Docker's
#: containers by its API): Docker's GPU request, a tmpfs as Docker mounts it, nothing to unset.
_DOCKER_FLAGS: dict[str, Callable[[Any], list[str]]] = {
    **_CREATE_FLAGS,
    "environment": _docker_env,
    "tmpfs": lambda value: [a for path, how in value.items() for a in ("--tmpfs", f"{path}:{how}" if how else path)],
    "device_requests": _docker_gpus,
}


def _cli_args(flags: Mapping[str, Callable[[Any], list[str]]], options: Mapping[str, Any], what: str) -> list[str]:
    """The arguments of *flags* for docker-py *options*, then the image and the command; an option with no such
    form is refused rather than dropped."""
    argv = []
    for key, value in options.items():
        if key in ("image", "command") or value in (None, False, [], {}):
            continue
        if key not in flags:
            raise EngineError(f"{what}: the option {key} has no CLI form in builder; it would be dropped")
        argv += flags[key](value)
    return [*argv, str(options["image"]), *[str(c) for c in options.get("command") or []]]


def _create_argv(options: Mapping[str, Any]) -> list[str]:
    """``podman create`` arguments for docker-py ``containers.create`` *options*.

    Example:
        >>> _create_argv({"image": "i", "command": ["ls"], "environment": {"A": "1"}, "working_dir": "/w",
        ...               "device_requests": [{"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=all"]}]})
        ['--env', 'A=1', '--workdir', '/w', '--device', 'nvidia.com/gpu=all', 'i', 'ls']
    """
    return _cli_args(_CREATE_FLAGS, options, "podman create")


def run_argv(kind: str, options: Mapping[str, Any], *, rootless: bool | None = None) -> list[str]:
    """The ``docker run`` or ``podman run`` line that runs a container of docker-py *options* as builder does
    (``builder run --dry-run``), removed when it ends. podman's comes from the table
    :meth:`PodmanEngine.create` creates containers with, with the same ``--userns keep-id`` (*rootless*: by
    default, whether this process is not root, as the podman CLI it names then runs) and the
    ``--tls-verify=false`` its pull from a loopback registry takes; Docker's from the same table with Docker's
    GPU request (builder itself runs Docker's containers by its API).

    Example:
        >>> run_argv("podman", {"image": "localhost:5000/r:gpu", "command": ["true"], "device_requests": [
        ...     {"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=all"]}]})
        ['podman', 'run', '--rm', '--tls-verify=false', '--device', 'nvidia.com/gpu=all', 'localhost:5000/r:gpu', 'true']
        >>> run_argv("docker", {"image": "r:gpu", "command": ["true"], "device_requests": [
        ...     docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]})
        ['docker', 'run', '--rm', '--gpus', 'all', 'r:gpu', 'true']
    """
    if kind == "docker":
        return ["docker", "run", "--rm", *_cli_args(_DOCKER_FLAGS, options, "docker run")]
    rootless = os.geteuid() != 0 if rootless is None else rootless
    keep_id = ["--userns", "keep-id"] if rootless and own_user(options) else []
    return ["podman", "run", "--rm", *_tls(registry.Ref.parse(str(options["image"])).host), *keep_id,
            *_create_argv(options)]


def _tls(host: str | None) -> list[str]:
    """Plain http for a loopback registry (Docker assumes it; podman must be told)."""
    return ["--tls-verify=false"] if host and registry.is_local(host) else []


#: A layer's media type by (the manifest's kind, its compression).
_LAYER_TYPES = {("oci", "zstd"): "application/vnd.oci.image.layer.v1.tar+zstd",
                ("oci", "gzip"): "application/vnd.oci.image.layer.v1.tar+gzip",
                ("docker", "gzip"): "application/vnd.docker.image.rootfs.diff.tar.gzip"}


def _compressed(data: bytes, compression: str) -> bytes:
    """The layer *data* (gzip, zstd or plain tar) in *compression*; gzip as the base's is (level 6, no time)."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    elif data[:4] == b"\x28\xb5\x2f\xfd":
        data = subprocess.run(["zstd", "-q", "-d", "-c"], input=data, capture_output=True, check=True,
                              env=child_env(PLAIN)).stdout
    if compression == "gzip":
        return gzip.compress(data, compresslevel=6, mtime=0)
    # one thread: zstd's multi-threaded frames differ from its single-threaded ones, and a digest must not
    # depend on the cores of the machine that pushed
    return subprocess.run(["zstd", "-q", "-3", "-c"], input=data, capture_output=True, check=True,
                          env=child_env(PLAIN)).stdout


def recompress(ref: str, compression: str, creds: dict[str, str] | None) -> str | None:
    """Every layer of the manifest *ref* in *compression*: the layers that are not are recompressed (the
    uncompressed bytes, so the config's diff IDs, stay), uploaded, and the manifest put under the same tag;
    return its new digest, or None when every layer was in *compression* already.

    Example:
        >>> recompress("localhost:5000/ml-runtime:cpu", "zstd", None)  # doctest: +SKIP
        'sha256:...'
    """
    found = artifacts.get_manifest(ref, creds)
    if found is None:
        return None
    media, body, _ = found
    doc = json.loads(body)
    kind = "oci" if "oci" in media else "docker"
    want = _LAYER_TYPES.get((kind, compression))
    if want is None:
        raise TargetFailed(f"push of {ref}: a {kind} manifest cannot carry {compression} layers")
    r = registry.Ref.parse(ref)
    changed = False
    for layer in doc.get("layers", []):
        if layer.get("mediaType") == want:
            continue
        data = artifacts.get_blob(r.name, layer["digest"], creds)
        if data is None:
            raise TargetFailed(f"push of {ref}: the registry lost layer {layer['digest']} just pushed")
        blob = _compressed(data, compression)
        layer.update(mediaType=want, digest=artifacts.push_blob(r.name, blob, creds), size=len(blob))
        changed = True
    if not changed:
        return None
    return artifacts.put_manifest(r.name, r.tag or "latest", json.dumps(doc, separators=(",", ":")).encode(), media,
                                  creds)


@contextlib.contextmanager
def _authfile(host: str | None, creds: dict[str, str] | None) -> Iterator[str | None]:
    """A private auth file naming *creds* for *host* (never an argument), removed afterwards; None without creds."""
    if not host or not creds:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="builder-auth-") as tmp:
        path = Path(tmp) / "auth.json"
        path.touch(mode=0o600)
        token = base64.b64encode(f"{creds['username']}:{creds['password']}".encode()).decode()
        path.write_text(json.dumps({"auths": {host: {"auth": token}}}))
        yield str(path)


def _explain(host: str, error: str) -> str:
    text = error.strip().splitlines()[0][:200]
    lowered = text.lower()
    if any(word in lowered for word in ("unauthorized", "authentication required", "denied", "no basic auth")):
        return (
            f"registry {host} refused the push ({text}); log in with 'docker login {host}' "
            "or set BUILDER_REGISTRY_USER and BUILDER_REGISTRY_PASSWORD"
        )
    if "connection refused" in lowered or "no such host" in lowered or "dial tcp" in lowered:
        return f"registry {host} is unreachable ({text}); start it or fix 'registry' in matrix.yaml"
    return f"push to {host} failed: {text}"
