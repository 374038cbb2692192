"""Docker as an :class:`~builder.oci.engine.Engine`: :class:`DockerEngine`, through docker-py and BuildKit
(``docker buildx``). The one module that imports docker-py: :class:`DockerAPI`, its Docker Engine API client,
also serves podman's Docker-compatible API (:mod:`builder.oci.podman` holds one), and the few docker-py types
the rest of builder speaks in (a container's GPU request, a bind mount, ``.dockerignore`` matching) are named
here.

Example:
    >>> run_argv({"image": "r:cpu", "command": ["true"], "shm_size": "1g"})
    ['docker', 'run', '--rm', '--shm-size', '1g', 'r:cpu', 'true']
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import docker
import docker.utils.build
import requests
from docker.errors import DockerException
from urllib3.exceptions import ReadTimeoutError

from builder.config.errors import UserError
from builder.oci import buildkit, registry, runflags
from builder.oci.engine import (
    TIMEOUT_S,
    BuildRequest,
    BuildResult,
    CacheRecord,
    ContainerTimeout,
    DiskUsage,
    EngineError,
    EngineFacts,
    ImageFacts,
    ImageUnknown,
    Lacks,
    PushFailed,
    engine_version,
)
from builder.oci.secrets import ENGINE, child_env

#: What docker-py raises when the engine refuses or cannot be reached (beside ``requests``' transport errors).
ClientError = DockerException
#: A container's device request (GPUs: the NVIDIA runtime's ``--gpus``, or CDI names), as the API takes it.
DeviceRequest = docker.types.DeviceRequest
#: A container's mount (``builder run``'s workspace), as the API takes it.
Mount = docker.types.Mount
#: The files of a folder that a ``.dockerignore``'s patterns leave out, as Docker matches them.
exclude_paths = docker.utils.build.exclude_paths

#: The oldest engine builds are tested on: BuildKit with named contexts and zstd, both image stores.
MIN_ENGINE = (26, 0)


def engine_address() -> str:
    """Where Docker listens: DOCKER_HOST, else its socket."""
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


def connect_docker(timeout: int = TIMEOUT_S) -> DockerEngine:
    """Docker at DOCKER_HOST, answering and 26 or newer; else one UserError that says how to get one."""
    try:
        engine = DockerEngine.from_env(timeout)
        version = engine.version()
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
    return engine


def image_store(info: Mapping[str, Any]) -> str:
    """``containerd`` or ``classic``: which image store the engine keeps images in, from its ``info()``."""
    status = info.get("DriverStatus") or []
    return "containerd" if any(pair[:2] == ["driver-type", "io.containerd.snapshotter.v1"] for pair in status) \
        else "classic"


def image_facts(found: Mapping[str, Any]) -> ImageFacts:
    """An image's facts from the API's ``inspect`` of it, or from a row of its images list or ``df``.

    Example:
        >>> image_facts({"Id": "sha256:1", "RepoTags": ["r:cpu"], "Config": {"Labels": {"a": "b"}}}).labels
        {'a': 'b'}
    """
    labels = found.get("Labels") if "Labels" in found else (found.get("Config") or {}).get("Labels")
    return ImageFacts(
        id=str(found.get("Id") or ""), tags=tuple(found.get("RepoTags") or ()),
        digests=tuple(found.get("RepoDigests") or ()), labels=dict(labels or {}),
        layers=tuple((found.get("RootFS") or {}).get("Layers") or ()), architecture=str(found.get("Architecture") or ""),
        size=int(found.get("Size") or 0), shared_size=max(int(found.get("SharedSize") or 0), 0),
        containers=max(int(found.get("Containers") or 0), 0))


def cache_record(found: Mapping[str, Any]) -> CacheRecord:
    """A build-cache record from a row of the API's ``df``."""
    return CacheRecord(
        id=str(found.get("ID") or ""), type=str(found.get("Type") or ""),
        description=str(found.get("Description") or ""), size=int(found.get("Size") or 0),
        shared=bool(found.get("Shared")), in_use=bool(found.get("InUse")),
        last_used=found.get("LastUsedAt") or None, usage_count=int(found.get("UsageCount") or 0))


def explanation(exc: DockerException) -> str:
    """The engine's own words for a refused request, not docker-py's request URL."""
    text = exc.explanation if isinstance(exc, docker.errors.APIError) and exc.explanation else str(exc)
    return (str(text).strip().splitlines() or ["?"])[0][:300]


class DockerAPI:
    """The Docker Engine API through docker-py, at any address that speaks it: Docker's, and podman's
    Docker-compatible service. What both engines ask of it the same way (inspect, tag, save/load, df,
    containers) is here once; each engine holds one and adds what it does its own way.
    """

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client

    @classmethod
    def at(cls, url: str, timeout: int = TIMEOUT_S) -> DockerAPI:
        """The API at *url* (``unix:///...``), unchecked: its first request may fail."""
        return cls(docker.DockerClient(base_url=url, timeout=timeout))

    def version(self) -> dict[str, Any]:
        """The API's ``version`` as it answers (``Version``, ``ApiVersion``, ...)."""
        return dict(self.client.version())

    def info(self) -> dict[str, Any]:
        """The API's ``info`` as it answers (``Driver``, ``DockerRootDir``, ``Runtimes``, ...)."""
        return dict(self.client.info())

    def facts(self, **engine: Any) -> EngineFacts:
        """:class:`EngineFacts` from the API's ``version`` and ``info``, with what the *engine* says of itself
        (its product, store, ...; podman's CDI folders, which its API does not list)."""
        version, info = self.version(), self.info()
        return EngineFacts(**{
            "version": str(version.get("Version") or "?"), "api_version": str(version.get("ApiVersion") or "?"),
            "store": image_store(info), "driver": str(info.get("Driver") or "?"),
            "root": str(info.get("DockerRootDir") or ""), "runtimes": tuple(sorted(info.get("Runtimes") or {})),
            "cdi_spec_dirs": tuple(info.get("CDISpecDirs") or ()), **engine})

    def get(self, path: str) -> Any:
        """The JSON answer to GET *path* (an endpoint docker-py has no method for: podman's ``/libpod/...``)."""
        answer = self.client.api._get(self.client.api._url(path))
        answer.raise_for_status()
        return answer.json()

    def image(self, ref: str) -> ImageFacts | None:
        try:
            return image_facts(self.client.api.inspect_image(ref))
        except docker.errors.ImageNotFound:
            return None

    def images(self) -> list[ImageFacts]:
        """Every image as the images list names it (its tags, digests, labels)."""
        return [image_facts(row) for row in self.client.api.images(all=True)]

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
        return list(found.digests) if found is not None else []

    def pull(self, ref: str, creds: dict[str, str] | None = None, *, platform: str | None = None) -> None:
        try:  # docker-py splits the tag or digest off the reference itself
            self.client.api.pull(ref, platform=platform, auth_config=creds)
        except docker.errors.APIError as exc:
            raise EngineError(explanation(exc)) from None

    def save(self, ref: str) -> Iterator[bytes]:
        yield from self.client.api.get_image(ref)

    def load(self, archive: Path | Iterable[bytes]) -> None:
        # docker-py's load_image is a generator: a failed load is an error event in it (or an API error
        # when the engine refuses the request), so it is read to the end here, never left unread.
        try:
            with contextlib.ExitStack() as stack:
                data = stack.enter_context(archive.open("rb")) if isinstance(archive, Path) else iter(archive)
                for event in self.client.api.load_image(data):
                    if "error" in event:
                        raise EngineError(str(event["error"]).strip()[:300])
        except docker.errors.APIError as exc:
            raise EngineError(explanation(exc)) from None

    def remove_image(self, ref: str) -> str | None:
        try:
            self.client.api.remove_image(ref)
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError as exc:  # a container uses it (conflict): kept
            return explanation(exc)[:200]
        return None

    def disk_usage(self) -> DiskUsage:
        usage = self.client.api.df()
        return DiskUsage(tuple(image_facts(row) for row in usage.get("Images") or ()),
                         tuple(cache_record(row) for row in usage.get("BuildCache") or ()))

    def run(self, image: str, command: Sequence[str], *, labels: Mapping[str, str], timeout: int,
            **options: Any) -> tuple[int, str, str]:
        return self._run_to_end(self.client.containers.create(image, list(command), labels=dict(labels), **options),
                                timeout)

    def run_created(self, container: str, timeout: int) -> tuple[int, str, str]:
        """:meth:`run` of a container created already (by ID)."""
        return self._run_to_end(self.client.containers.get(container), timeout)

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
            raise EngineError(explanation(exc)) from None

    def attach(self, container: str) -> Iterator[tuple[bytes | None, bytes | None]]:
        # logs=True as well: not a byte written before the attach is lost.
        stream = self.client.api.attach(container, stdout=True, stderr=True, stream=True, logs=True, demux=True)
        return iter(stream)

    def start(self, container: str) -> None:
        try:
            self.client.api.start(container)
        except docker.errors.APIError as exc:
            raise EngineError(explanation(exc)) from None

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


class DockerEngine:
    """:class:`~builder.oci.engine.Engine` over the Docker Engine API (:class:`DockerAPI`) and BuildKit
    (``docker buildx``).

    Example:
        >>> connect_docker().image("localhost:5000/ml-runtime:cpu").id  # doctest: +SKIP
        'sha256:...'
    """

    def __init__(self, api: DockerAPI) -> None:
        self.api = api

    @classmethod
    def from_env(cls, timeout: int = TIMEOUT_S) -> DockerEngine:
        """The engine DOCKER_HOST names (else the local socket), unchecked: its first request may fail."""
        return cls(DockerAPI(docker.from_env(timeout=timeout)))

    @property
    def client(self) -> docker.DockerClient:
        """The docker-py client, for what a test inspects beside the builder."""
        return self.api.client

    def name(self) -> str:
        return "docker"

    def address(self) -> str:
        return engine_address()

    def store_key(self) -> str:
        return self.address()

    def label(self) -> tuple[str, str]:
        return f"Docker engine at {self.address()}", "docker info"

    def version(self) -> str:
        return str(self.api.version().get("Version") or "")

    def info(self) -> EngineFacts:
        return self.api.facts(product="Docker", disk_fix="docker system prune (or docker builder prune), or move "
                              "data-root to a larger disk")

    def lacks(self) -> Lacks:
        return Lacks()  # what builds need of Docker (its release, buildx, the image store) doctor checks as such

    def store(self) -> str:
        return image_store(self.api.info())

    def image(self, ref: str) -> ImageFacts | None:
        return self.api.image(ref)

    def resolve(self, names: Sequence[str]) -> str:
        for name in names:
            found = self.image(name)
            if found is not None:
                return found.id
        raise ImageUnknown(f"the engine knows none of {', '.join(names)}, which the build just made; "
                           "is DOCKER_HOST the engine buildx builds on? (select the builder with --builder)")

    def tag(self, image: str, ref: str) -> None:
        self.api.tag(image, ref)

    def size(self, image: str) -> int:
        return self.api.size(image)

    def labels(self, image: str) -> dict[str, str]:
        return self.api.labels(image)

    def repo_digests(self, ref: str) -> list[str]:
        return self.api.repo_digests(ref)

    def pull(self, ref: str, creds: dict[str, str] | None = None, *, platform: str | None = None) -> None:
        self.api.pull(ref, creds, platform=platform)

    def push(self, ref: str, compression: str = "gzip") -> str:
        r = registry.Ref.parse(ref)
        creds = registry.credentials(r.host)
        digest = None
        try:
            for event in self.api.client.api.push(r.name, tag=r.tag, auth_config=creds, stream=True, decode=True):
                if "error" in event:
                    raise PushFailed(registry.push_refused(r.host, event["error"]))
                digest = (event.get("aux") or {}).get("Digest", digest)
        except docker.errors.APIError as exc:
            raise PushFailed(registry.push_refused(r.host, exc.explanation or str(exc))) from None
        except docker.errors.DockerException as exc:
            raise PushFailed(f"push of {ref} failed: {exc}") from None
        reported = registry.manifest_digest(ref, creds)
        if digest is None:  # the containerd image store reports none: the local image's names say it
            digest = reported if reported and f"{r.name}@{reported}" in self.repo_digests(ref) else None
            if digest is None:
                raise PushFailed(f"push of {ref}: the registry has {reported}, which the engine does not know "
                                 "as this image (another push to the same tag?); push again")
        if reported != digest:
            raise PushFailed(f"push of {ref}: registry reports {reported}, the engine pushed {digest}")
        return digest

    def save(self, ref: str) -> Iterator[bytes]:
        return self.api.save(ref)

    def load(self, archive: Path | Iterable[bytes]) -> None:
        self.api.load(archive)

    def serves_image_contexts(self, builder: str | None) -> bool:
        # BuildKit's docker driver reads the containerd store's images in place; the classic store's
        # would be exported to it first, and another builder would look for them in a registry
        return builder is None and self.store() == "containerd"

    def remove_image(self, ref: str) -> str | None:
        return self.api.remove_image(ref)

    def disk_usage(self) -> DiskUsage:
        return self.api.disk_usage()

    def build_cache(self) -> list[CacheRecord]:
        api = self.api.client.api  # API 1.42+: ?type= measures that kind alone (docker-py's df() takes no type)
        answer = api._result(api._get(api._url("/system/df"), params={"type": "build-cache"}), json=True)
        return [cache_record(row) for row in answer.get("BuildCache") or ()]

    def prune_build_cache(self, record: str) -> str | None:
        # buildx 0.13's filters are ANDed and know no regular expression (~=): one record a call.
        proc = subprocess.run(["docker", "buildx", "prune", "--force", "--filter", f"id={record}"],
                              capture_output=True, text=True, check=False, env=child_env(ENGINE))
        return proc.stderr.strip()[-300:] if proc.returncode != 0 else None

    def build(
        self,
        request: BuildRequest,
        *,
        on_step: Callable[[int, int, str], None] = lambda n, total, text: None,
        on_log: Callable[[str], None] = lambda line: None,
        cancel: threading.Event | None = None,
        registry_host: str | None = None,
        cwd: Path | None = None,
    ) -> tuple[str, BuildResult]:
        """BuildKit reads the base and the cache from *registry_host* itself, with the same credentials."""
        creds = registry.credentials(registry_host) if registry_host else None
        if request.early_stages and not request.builder and self.store() == "classic":
            request = replace(request, early_stages=())  # its docker driver keeps layers uncompressed: nothing to do early
        result = buildkit.run(request, on_step=on_step, on_log=on_log, cancel=cancel, registry_host=registry_host,
                              creds=creds, cwd=cwd)
        return self.resolve(result.ids), result

    def run(self, image: str, command: Sequence[str], *, labels: Mapping[str, str], timeout: int,
            **options: Any) -> tuple[int, str, str]:
        return self.api.run(image, command, labels=labels, timeout=timeout, **options)

    def create(self, options: Mapping[str, Any]) -> str:
        return self.api.create(options)

    def attach(self, container: str) -> Iterator[tuple[bytes | None, bytes | None]]:
        return self.api.attach(container)

    def start(self, container: str) -> None:
        self.api.start(container)

    def wait(self, container: str) -> int:
        return self.api.wait(container)

    def stop(self, container: str, timeout: int) -> None:
        self.api.stop(container, timeout)

    def containers(self, label: str) -> list[str]:
        return self.api.containers(label)

    def container_labels(self, label: str) -> dict[str, dict[str, str]]:
        return self.api.container_labels(label)

    def remove_container(self, container: str) -> None:
        self.api.remove_container(container)

    def close(self) -> None:
        self.api.close()


def run_argv(options: Mapping[str, Any]) -> list[str]:
    """The ``docker run`` line that runs a container of docker-py *options* as builder does (``builder run
    --dry-run``), removed when it ends.

    Example:
        >>> run_argv({"image": "r:gpu", "command": ["true"], "device_requests": [
        ...     DeviceRequest(count=-1, capabilities=[["gpu"]])]})
        ['docker', 'run', '--rm', '--gpus', 'all', 'r:gpu', 'true']
    """
    return ["docker", "run", "--rm", *runflags.cli_args(runflags.RUN_FLAGS, options, "docker run")]
