"""Which engine, connected: :func:`connect` finds one (``--engine``/``BUILDER_ENGINE``, else Docker, then podman)
or says in one line how to get one; :func:`engine_kind` names it without connecting; :func:`run_argv` is the
chosen engine's ``run`` line. The one module that knows every engine: a third one is a module beside
:mod:`builder.oci.docker` and :mod:`builder.oci.podman`, and a name here.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from typing import Any

from builder.config.errors import UserError
from builder.oci import docker, podman
from builder.oci.engine import TIMEOUT_S, Engine, chosen_engine


def connect(timeout: int = TIMEOUT_S, kind: str | None = None) -> Engine:
    """The engine *kind* (default: the chosen one, BUILDER_ENGINE), else Docker if it answers (only Docker when
    DOCKER_HOST is set), else podman if installed; checked for its version; else one UserError that says how to
    get one.

    Example:
        >>> connect().version()  # doctest: +SKIP
        '26.1.5+dfsg1'
    """
    kind = chosen_engine(kind)
    if kind == "podman":
        return podman.connect_podman(timeout)
    if kind == "docker" or _docker_only():
        return docker.connect_docker(timeout)
    try:
        return docker.connect_docker(timeout)
    except UserError as no_docker:
        try:
            return podman.connect_podman(timeout)
        except UserError as no_podman:
            raise UserError(f"{no_docker}; and podman: {no_podman}") from None


def _docker_only() -> bool:
    """Whether Docker is the engine when none is chosen, without asking it: no podman, or a DOCKER_HOST the user
    set (it names the engine: when it does not answer, say so rather than run on another engine behind their
    back; podman's own CONTAINER_HOST is read once podman is chosen)."""
    return shutil.which("podman") is None or bool(os.environ.get("DOCKER_HOST"))


def engine_kind(timeout: int = 15, kind: str | None = None) -> str:
    """The engine :func:`connect` would give, by name: the chosen one (*kind*, else BUILDER_ENGINE), else
    ``docker`` where it is the only candidate or answers, else ``podman``. ``builder run`` plans for it (its
    device flags, its command line) before it connects; Docker is asked only where neither is chosen and both
    are installed.

    Example:
        >>> engine_kind()  # doctest: +SKIP
        'docker'
    """
    kind = chosen_engine(kind)
    if kind:
        return kind
    if _docker_only():
        return "docker"
    try:
        docker.connect_docker(timeout).close()
    except UserError:
        return "podman"
    return "docker"


def run_argv(kind: str, options: Mapping[str, Any], *, rootless: bool | None = None) -> list[str]:
    """The ``docker run`` or ``podman run`` line that runs a container of docker-py *options* as builder does
    (``builder run --dry-run``): :func:`builder.oci.docker.run_argv`, :func:`builder.oci.podman.run_argv`.

    Example:
        >>> run_argv("docker", {"image": "r:cpu", "command": ["true"]})
        ['docker', 'run', '--rm', 'r:cpu', 'true']
    """
    return docker.run_argv(options) if kind == "docker" else podman.run_argv(options, rootless=rootless)
