"""The builder's loopback registry: where it lives and its login, one per user and port.

``<state>/registry-<port>/`` (:func:`folder`, mode 0700) holds what :mod:`builder.oci.localregistry`
runs: its configuration, data, log and PID file; and its login: the user ``builder`` with a random
password in ``password`` (0600), whose bcrypt hash in ``htpasswd`` (0600) the registry checks on every
request. No request without it is answered, so nobody else on the host can push, pull or delete there.

:func:`login` is what :func:`builder.oci.registry.credentials` gives every client of that port: the
builder's own requests, the engine's pushes and pulls, buildx (its pushes and cache exports), cosign
and podman, the last three through a private auth file for the call. The user's own
``~/.docker/config.json`` is never written: ``docker login localhost:5000 -u builder --password-stdin
< ~/.cache/ml-image-builder/registry-5000/password`` does it by hand.

Example:
    >>> port("localhost:5000"), port("[::1]:5001"), port("127.0.0.1")
    ('5000', '5001', '80')
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from builder.config.files import atomic_write
from builder.config.state import state_dir

USER = "builder"
#: bcrypt's cost. The registry checks the hash on every request, and the password is 256 random bits:
#: there is no guess for a higher cost to slow down.
ROUNDS = 4


def port(host: str) -> str:
    """The port of a loopback ``host[:port]`` (80 when none is given)."""
    tail = host.rpartition("]")[2]
    return tail.rsplit(":", 1)[1] if ":" in tail else "80"


def folder(host: str) -> Path:
    """The folder of the builder's registry on *host*'s port (nothing is created)."""
    return state_dir() / f"registry-{port(host)}"


def login(host: str) -> dict[str, str] | None:
    """The login of the builder's registry on *host*'s port; None when the builder never made one there."""
    with contextlib.suppress(OSError):
        if password := (folder(host) / "password").read_text(encoding="utf-8").strip():
            return {"username": USER, "password": password}
    return None


def private_folder(where: Path) -> Path:
    """*where*, created if absent, readable by this user alone (0700; an earlier version's was 0755)."""
    where.mkdir(parents=True, exist_ok=True)
    os.chmod(where, 0o700)
    return where


def make_login(where: Path) -> dict[str, str]:
    """The login of the registry in *where*: its password, made with its ``htpasswd`` when there is none,
    and the ``htpasswd`` written again when it does not hold that password's hash. Call it under the
    folder's lock (:func:`builder.oci.localregistry.ensure_local` does)."""
    import bcrypt  # only where a registry is started

    private_folder(where)
    secret, htpasswd = where / "password", where / "htpasswd"
    try:
        password = secret.read_text(encoding="utf-8").strip()
    except OSError:
        password = ""
    try:
        user, _, hashed = htpasswd.read_text(encoding="utf-8").strip().partition(":")
        current = bool(password) and user == USER and bcrypt.checkpw(password.encode(), hashed.encode())
    except (OSError, ValueError):
        current = False
    if not current:
        password = password or secrets.token_urlsafe(32)
        atomic_write(htpasswd, f"{USER}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(ROUNDS)).decode()}\n",
                     mode=0o600)
        atomic_write(secret, password + "\n", mode=0o600)
    return {"username": USER, "password": password}
