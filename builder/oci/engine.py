"""Connect to the Docker engine, or explain in one line how to get one."""

from __future__ import annotations

import os
import re
from typing import Any

import docker
from docker.errors import DockerException

from builder.config.errors import UserError

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
