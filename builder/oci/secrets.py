"""The secrets of the environment, and the environment a child process (buildx, cosign) gets without them."""

from __future__ import annotations

import os

USER_ENV, PASSWORD_ENV = "BUILDER_REGISTRY_USER", "BUILDER_REGISTRY_PASSWORD"
#: Every variable that holds a registry or signing secret: the builder's own (registry login,
#: signing key and its passphrase, the key handed to cosign) and cosign's. No child process
#: (docker buildx, cosign) inherits them; what one needs is handed to it on its own.
SECRET_ENV = frozenset({USER_ENV, PASSWORD_ENV, "BUILDER_SIGNING_KEY", "BUILDER_SIGNING_KEY_PASSWORD",
                        "BUILDER_COSIGN_KEY", "COSIGN_PASSWORD", "COSIGN_KEY", "BUILDER_VERIFY_KEY"})


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without :data:`SECRET_ENV`, plus *extra*: what a child process gets.

    Example:
        >>> env = child_env({"DOCKER_CONFIG": "/tmp/c"})
        >>> "BUILDER_REGISTRY_PASSWORD" in env, env["DOCKER_CONFIG"]
        (False, '/tmp/c')
    """
    return {**{k: v for k, v in os.environ.items() if k not in SECRET_ENV}, **(extra or {})}
