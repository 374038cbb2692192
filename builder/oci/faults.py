"""Faults of the engine and registries as one line and an exit code, never a traceback.

docker-py raises ``requests`` transport errors (the engine went away, a read timed out) beside
its own ``DockerException``; the registry client (:mod:`builder.oci.registry`) turns its own into
:class:`RegistryFault` or a ``UserError``, and a ``urllib.error`` is a registry's too.
:func:`describe` names the engine or the registry, the cause and the fix; the CLI prints it and
exits with the code of its class (:data:`EXIT_ENGINE`, :data:`EXIT_REGISTRY`, :data:`EXIT_FAULT`).

Example:
    >>> describe(requests.exceptions.ConnectionError("refused")).code
    3
"""

from __future__ import annotations

import urllib.error
import urllib.parse
from dataclasses import dataclass

import requests.exceptions

from builder.config.urls import public
from builder.oci.docker import ClientError, engine_address, explanation
from builder.oci.engine import Engine, EngineError, ImageUnknown, PushFailed
from builder.oci.registry import RegistryFault

#: The Docker engine failed or could not be reached.
EXIT_ENGINE = 3
#: A registry (or its token endpoint) failed, refused or could not be reached.
EXIT_REGISTRY = 4
#: Anything else unexpected: a fault of the builder itself.
EXIT_FAULT = 70

#: What :func:`describe` knows by name (callers that must not stop catch these).
KNOWN: tuple[type[BaseException], ...] = (
    ClientError, EngineError, RegistryFault, requests.exceptions.RequestException, urllib.error.URLError,
)


@dataclass(frozen=True)
class Fault:
    line: str
    code: int


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else exc.__class__.__name__)[:200]


def _host(url: str | None) -> str:
    return urllib.parse.urlsplit(public(url or "")).netloc or "?"


def describe(exc: BaseException, engine: Engine | None = None) -> Fault:
    """One line naming *engine* (Docker at DOCKER_HOST where none is connected) or the registry, the cause and
    the fix; the exit code of its class."""
    if isinstance(exc, RegistryFault):
        return Fault(str(exc), EXIT_REGISTRY)
    if isinstance(exc, urllib.error.HTTPError):
        host, code = _host(exc.url), exc.code
        if code in (401, 403):
            fix = f"log in again (docker login {host}, or BUILDER_REGISTRY_USER/BUILDER_REGISTRY_PASSWORD)"
        elif code == 429:
            fix = "rate-limited: wait and retry, or log in for a higher limit"
        else:
            fix = "the registry failed: retry, or check its logs"
        return Fault(f"registry {host} answered HTTP {code} for {public(exc.url)}: {fix}", EXIT_REGISTRY)
    if isinstance(exc, urllib.error.URLError):
        return Fault(f"registry unreachable ({_first_line(exc)}): start it or fix 'registry' in matrix.yaml",
                     EXIT_REGISTRY)
    name, check = engine.label() if engine is not None else (f"Docker engine at {engine_address()}", "docker info")
    if isinstance(exc, requests.exceptions.Timeout):
        return Fault(f"{name} timed out ({exc.__class__.__name__}: "
                     f"{_first_line(exc)}); check `{check}` and retry", EXIT_ENGINE)
    if isinstance(exc, PushFailed | ImageUnknown):  # their own line names the registry or engine, and the fix
        return Fault(str(exc), EXIT_ENGINE)
    if isinstance(exc, EngineError):
        return Fault(f"{name} refused a request ({_first_line(exc)}); "
                     f"check that it runs (`{check}`) and retry", EXIT_ENGINE)
    if isinstance(exc, requests.exceptions.RequestException | ClientError):
        what = explanation(exc) if isinstance(exc, ClientError) else _first_line(exc)
        return Fault(f"{name} failed ({exc.__class__.__name__}: {str(what)[:200]}); "
                     f"check that it runs (`{check}`) and retry", EXIT_ENGINE)
    return Fault(f"internal error ({exc.__class__.__name__}: {_first_line(exc)}); "
                 "BUILDER_TRACEBACK=1 shows where", EXIT_FAULT)
