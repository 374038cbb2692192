"""``docker login``'s credentials: the Docker config (``$DOCKER_CONFIG/config.json``, else ``~/.docker``) and the
credential helpers it names, read by docker-py's own reader. Beside :mod:`builder.oci.docker`, the one module that
imports docker-py: the registry client asks it for any registry's login, and the engine pushes through the
registry client, so this cannot live in the engine's module without a circle.
"""

from __future__ import annotations

import os

import docker.auth

from builder.oci.secrets import SECRET_ENV


def login(host: str) -> dict[str, str] | None:
    """The Docker config's login for *host* (its own entry, or its credential helper's), else None."""
    # docker-py runs a credential helper (credsStore) with the whole environment and takes only additions:
    # the secrets are blanked for it
    blank = {name: "" for name in SECRET_ENV if name in os.environ}
    found = docker.auth.load_config(credstore_env=blank).resolve_authconfig(host) or {}
    # a config's own entry says username/password, a credential helper's Username/Password
    name, secret = found.get("username") or found.get("Username"), found.get("password") or found.get("Password")
    return {"username": name, "password": secret} if name and secret else None
