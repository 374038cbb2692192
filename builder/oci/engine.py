"""Connect to the Docker engine, or explain in one line how to get one; :class:`Engine`, what the
build path needs of it, behind one interface.

Example:
    >>> engine_version("26.1.5+dfsg1")
    (26, 1)
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import docker
from docker.errors import DockerException

from builder.config.errors import TargetFailed, UserError
from builder.oci import buildkit, registry

#: Builds stream for minutes; the default 60 s read timeout would cut them off.
TIMEOUT_S = 3600


def engine_address() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


#: The oldest engine builds are tested on: BuildKit with named contexts and zstd, both image stores.
MIN_ENGINE = (26, 0)


def connect() -> docker.DockerClient:
    """A docker-py client whose engine answered, and is Docker 26 or newer.

    Example:
        >>> connect().version()["Version"]  # doctest: +SKIP
        '26.1.5+dfsg1'
    """
    try:
        client = docker.from_env(timeout=TIMEOUT_S)
        version = str(client.version().get("Version", ""))
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
    return client


def engine_version(version: str) -> tuple[int, int]:
    """``26.1.5+dfsg1`` -> (26, 1); unparsable -> (0, 0).

    Example:
        >>> engine_version("26.1.5+dfsg1")
        (26, 1)
    """
    parts = re.findall(r"\d+", version)[:2]
    return (int(parts[0]), int(parts[1]) if len(parts) > 1 else 0) if parts else (0, 0)


def image_id(client: docker.DockerClient, names: tuple[str, ...] | list[str]) -> str:
    """The engine's ID of an image known by several digests (manifest, config): the first it knows.

    The containerd image store names an image by its manifest digest, the classic store by its
    config digest; asking the engine holds in both.
    """
    for name in names:
        try:
            return str(client.api.inspect_image(name)["Id"])
        except docker.errors.ImageNotFound:
            continue
    raise UserError(f"the engine knows none of {', '.join(names)}, which the build just made; "
                    "is DOCKER_HOST the engine buildx builds on? (select the builder with --builder)")


def image_size(client: docker.DockerClient, ref: str) -> int:
    """The image's unpacked size in bytes, as the classic store's ``Size`` says it.

    The containerd store's ``Size`` counts the compressed content instead (a 1.06 GB image shows
    as 0.30 GB); every layer's own size in the history is the unpacked one in both stores, save a
    foreign platform's image in the containerd store, which has no history there.
    """
    try:
        return sum(int(entry.get("Size") or 0) for entry in client.api.history(ref))
    except docker.errors.NotFound:
        # Docker 26's containerd store has no history of a foreign platform's image ("snapshot ... does
        # not exist"): its own Size, the compressed content, is the figure it has.
        return int(client.api.inspect_image(ref).get("Size") or 0)


def image_store(info: dict[str, Any]) -> str:
    """``containerd`` or ``classic``: which image store the engine keeps images in, from its ``info()``."""
    status = info.get("DriverStatus") or []
    return "containerd" if any(pair[:2] == ["driver-type", "io.containerd.snapshotter.v1"] for pair in status) \
        else "classic"


class Engine:
    """What a build needs of the engine, in one place: images by name (inspect, tag, size, labels),
    builds (``docker buildx``, :mod:`builder.oci.buildkit`), pushes and pulls, the image store,
    and the containers a label marks. repo2docker's ``ContainerEngine`` is the model: the build's
    executor (:mod:`builder.images.execute`) takes one as a parameter, so its unit tests pass a
    recording stand-in with these methods, and ``tests/engine`` test this one on a real engine.

    ``client`` stays the docker-py client for what runs containers (the smoke test, the base).

    Example:
        >>> Engine.of(connect()).image("localhost:5000/ml-runtime:cpu")["Id"]  # doctest: +SKIP
        'sha256:...'
    """

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client

    @classmethod
    def of(cls, client: Engine | docker.DockerClient) -> Engine:
        """The Engine over a docker-py client; anything else is taken for an Engine (or a stand-in of one)."""
        return cls(client) if isinstance(client, docker.DockerClient) else client

    def image(self, ref: str) -> dict[str, Any] | None:
        """The engine's ``inspect`` of an image, or None when it has no image of that name."""
        try:
            return dict(self.client.api.inspect_image(ref))
        except docker.errors.ImageNotFound:
            return None

    def resolve(self, names: Sequence[str]) -> str:
        """The engine's ID of an image a build named by several digests (:func:`image_id`)."""
        return image_id(self.client, tuple(names))

    def tag(self, image: str, ref: str) -> None:
        """Point *ref* (``repo:tag``) at *image*, moving it from whatever it named."""
        repo, tag = ref.rsplit(":", 1)
        self.client.api.tag(image, repo, tag, force=True)

    def size(self, image: str) -> int:
        """The image's unpacked size in bytes (:func:`image_size`)."""
        return image_size(self.client, image)

    def labels(self, image: str) -> dict[str, str]:
        """The labels of the image's config."""
        return dict(self.client.api.inspect_image(image)["Config"].get("Labels") or {})

    def repo_digests(self, ref: str) -> list[str]:
        """``repo@sha256:...`` of every registry the engine pushed the image to or pulled it from."""
        found = self.image(ref)
        return list((found or {}).get("RepoDigests") or [])

    def store(self) -> str:
        """``containerd`` or ``classic`` (:func:`image_store`): one request to the engine."""
        return image_store(self.client.info())

    def pull(self, ref: str, creds: dict[str, str] | None) -> None:
        """Pull *ref* (``repo:tag``) from its registry."""
        self.client.api.pull(*ref.rsplit(":", 1), auth_config=creds)

    def push(self, ref: str) -> str:
        """Push one tag; return the manifest digest the registry reports for it, checked against the engine's."""
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
        """Run one build through BuildKit; return the engine's ID of the image it made, and the result.

        BuildKit reads the base and the cache from *registry_host* itself, with the same credentials.
        """
        creds = registry.credentials(registry_host) if registry_host else None
        result = buildkit.run(request, on_step=on_step, on_log=on_log, cancel=cancel, registry_host=registry_host,
                              creds=creds, cwd=cwd)
        return self.resolve(result.ids), result

    def containers(self, label: str) -> list[str]:
        """The IDs of every container, running or not, carrying *label* (``key=value``)."""
        return [c["Id"] for c in self.client.api.containers(all=True, filters={"label": label})]

    def container_labels(self, label: str) -> dict[str, dict[str, str]]:
        """{ID: its labels} of every container, running or not, carrying *label* (``key`` or ``key=value``)."""
        return {c["Id"]: c.get("Labels") or {} for c in self.client.api.containers(all=True, filters={"label": label})}

    def remove_container(self, container: str) -> None:
        """Force-remove a container; one gone already, or being removed, is no error."""
        try:
            self.client.api.remove_container(container, force=True)
        except docker.errors.APIError:
            pass


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
