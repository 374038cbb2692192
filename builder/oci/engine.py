"""Connect to the Docker engine, or explain in one line how to get one."""

from __future__ import annotations

import os

import docker
from docker.errors import DockerException

from builder.config.errors import UserError

#: Builds stream for minutes; the default 60 s read timeout would cut them off.
TIMEOUT_S = 3600


def engine_address() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


def connect() -> docker.DockerClient:
    """A docker-py client whose engine answered a ping.

    Example:
        >>> connect().version()["ApiVersion"]
        '1.41'
    """
    try:
        client = docker.from_env(timeout=TIMEOUT_S)
        client.ping()
    except DockerException as exc:
        reason = str(exc).splitlines()[0][:160]
        raise UserError(
            f"no Docker engine answers at {engine_address()} ({reason}); start one "
            "(systemctl start docker, or dockerd &) or point DOCKER_HOST at a running engine"
        ) from None
    return client
