"""The environment each child process gets: what that tool reads, and no secret it does not use.

Every program the builder starts gets :func:`child_env` of its tool's allow-list (:data:`ENGINE`,
:data:`PODMAN`, :data:`PIP`, :data:`UV`, :data:`GIT`, ...): the variables of this process's environment
that the tool reads, never one of :data:`SECRET_ENV` (the registry login, the signing key and its
password), plus what the caller hands it on its own (cosign's key, a private ``DOCKER_CONFIG``). The rest
(a cloud key, a CI token, another tool's settings) stays with the builder: ``docker-registry`` serve, a
daemon that outlives the run, sees no more than ``PATH`` and the locale.

A Docker credential helper (``credsStore``, ``credHelpers``) runs as a child of the tools that log in to
a registry (docker, podman, cosign) and reads the environment for its own login (ecr-login ``AWS_*``,
pass ``GNUPGHOME``, secretservice D-Bus): those variables (:data:`HELPERS`) go to those tools only where
the user's registry configuration names a helper.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from fnmatch import fnmatchcase
from pathlib import Path

USER_ENV, PASSWORD_ENV = "BUILDER_REGISTRY_USER", "BUILDER_REGISTRY_PASSWORD"
#: Every variable that holds a registry or signing secret: the builder's own (registry login,
#: signing key and its passphrase, the key handed to cosign) and cosign's. No child process inherits
#: them, whatever its allow-list; what one needs is handed to it on its own.
SECRET_ENV = frozenset({USER_ENV, PASSWORD_ENV, "BUILDER_SIGNING_KEY", "BUILDER_SIGNING_KEY_PASSWORD",
                        "BUILDER_COSIGN_KEY", "COSIGN_PASSWORD", "COSIGN_KEY", "BUILDER_VERIFY_KEY"})

#: Every child: where programs are, whose home, the locale, the temp folder.
BASE = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "LC_*", "TZ", "TMPDIR")
#: Every child that fetches: the proxies and OpenSSL's CA bundle.
NETWORK = ("http_proxy", "https_proxy", "no_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
           "ALL_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR")
#: The docker CLI and buildx: the engine, its TLS, the user's builders and contexts (named one by one:
#: DOCKER_PASSWORD or GitLab's DOCKER_AUTH_CONFIG are CI secrets, no setting of the CLI's).
ENGINE = (*BASE, *NETWORK, "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT", "DOCKER_CERT_PATH", "DOCKER_TLS",
          "DOCKER_TLS_VERIFY", "DOCKER_API_VERSION", "BUILDX_*", "BUILDKIT_*")
#: podman (its CLI, ``podman build``, ``podman system service``): its connection, storage and registries
#: configuration, and what rootless podman needs (the runtime folder, the session bus for systemd's cgroups).
PODMAN = (*BASE, *NETWORK, "CONTAINER_HOST", "CONTAINER_CONNECTION", "CONTAINERS_*", "REGISTRY_AUTH_FILE",
          "PODMAN_*", "BUILDAH_*", "STORAGE_DRIVER", "STORAGE_OPTS", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME",
          "XDG_DATA_HOME", "DBUS_SESSION_BUS_ADDRESS")
#: cosign: the Docker config it reads the registry login from (the key comes as an extra, on its own).
COSIGN = (*BASE, *NETWORK, "DOCKER_CONFIG")
#: pip: its configuration (PIP_*: the user's own index and its login, if any), netrc, its CA bundles.
PIP = (*BASE, *NETWORK, "PIP_*", "NETRC", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "XDG_CONFIG_HOME",
       "XDG_CONFIG_DIRS", "XDG_CACHE_HOME")
#: uv: its configuration (UV_*), netrc.
UV = (*BASE, *NETWORK, "UV_*", "NETRC", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "XDG_CACHE_HOME")
#: git (``rev-parse``, ``status``, ``remote``: nothing over the network): its configuration files, which
#: may name the checkout a ``safe.directory``. Not GIT_DIR/GIT_WORK_TREE: the checkout is ``-C root``.
GIT = (*BASE, "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM", "GIT_CEILING_DIRECTORIES",
       "XDG_CONFIG_HOME")
#: mmdebstrap (and apt inside it): the host's apt configuration, for the keyring it checks the mirror by.
MMDEBSTRAP = (*BASE, *NETWORK, "APT_CONFIG")
#: hadolint: its configuration.
HADOLINT = (*BASE, "HADOLINT_*", "XDG_CONFIG_HOME", "NO_COLOR")
#: Tools that need nothing of the user's: docker-registry (REGISTRY_* would override its configuration: its
#: address, its storage), zstd (ZSTD_CLEVEL/ZSTD_NBTHREADS would change the bytes, and so the digests),
#: enroot's version.
PLAIN = BASE
#: sbatch: the job inherits the submitting environment (Slurm's default, ``--export=ALL``), which the
#: user's command may read; the builder's secrets are no part of it.
ALL = ("*",)
#: What a Docker credential helper reads for its own login (ecr-login, gcr, acr-env, pass,
#: secretservice): given, beside :data:`ENGINE`, :data:`PODMAN` and :data:`COSIGN`, only where the
#: registry configuration names a helper.
HELPERS = ("AWS_*", "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_*", "AZURE_*", "PASSWORD_STORE_*", "GNUPGHOME",
           "GPG_AGENT_INFO", "GPG_TTY", "DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR")
_LOGS_IN = (ENGINE, PODMAN, COSIGN)


def child_env(allowed: tuple[str, ...], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a child of the tool *allowed* (its names and ``fnmatch`` patterns) gets: those
    variables of this process, never one of :data:`SECRET_ENV`, plus *extra*.

    Example:
        >>> env = child_env(ENGINE, {"DOCKER_CONFIG": "/tmp/c"})
        >>> "BUILDER_REGISTRY_PASSWORD" in env, "PIP_INDEX_URL" in env, env["DOCKER_CONFIG"]
        (False, False, '/tmp/c')
    """
    extra = dict(extra or {})
    if allowed in _LOGS_IN and _names_helper({**os.environ, **extra}):
        allowed = (*allowed, *HELPERS)
    kept = {k: v for k, v in os.environ.items()
            if k not in SECRET_ENV and any(fnmatchcase(k, pattern) for pattern in allowed)}
    return {**kept, **extra}


def _names_helper(env: Mapping[str, str]) -> bool:
    """Whether the registry configuration *env* points at (Docker's config.json, podman's auth.json) names
    a credential helper."""
    home = Path(env.get("HOME") or Path.home())
    files = [Path(env.get("DOCKER_CONFIG") or home / ".docker") / "config.json",
             Path(env.get("XDG_CONFIG_HOME") or home / ".config") / "containers" / "auth.json"]
    if env.get("REGISTRY_AUTH_FILE"):
        files.append(Path(env["REGISTRY_AUTH_FILE"]))
    # podman's own default: the user's runtime folder (rootless), else root's
    files.append(Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json" if env.get("XDG_RUNTIME_DIR")
                 else Path(f"/run/containers/{os.getuid()}/auth.json"))
    for path in files:
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(config, dict) and (config.get("credsStore") or config.get("credHelpers")):
            return True
    return False
