"""docker-py container options (``containers.create``'s, those builder gives) as the CLIs' arguments:
:data:`RUN_FLAGS` is ``docker run``'s (``builder run --dry-run`` on Docker), which podman's CLI takes too but for
the entries :data:`builder.oci.podman.CREATE_FLAGS` gives its own; :func:`cli_args` refuses an option with no
such form rather than drop it.

Example:
    >>> cli_args(RUN_FLAGS, {"image": "r:cpu", "command": ["true"], "shm_size": "1g"}, "docker run")
    ['--shm-size', '1g', 'r:cpu', 'true']
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from builder.oci.engine import EngineError


def _docker_gpus(requests: Sequence[Mapping[str, Any]]) -> list[str]:
    """``docker run``'s forms: ``--gpus all`` for every GPU (the NVIDIA runtime's request), ``--device`` a CDI name."""
    argv = []
    for request in requests:
        if request.get("Driver") == "cdi":
            argv += [arg for name in request.get("DeviceIDs") or [] for arg in ("--device", name)]
        elif request.get("Count") == -1 and not request.get("DeviceIDs") and request.get("Capabilities") == [["gpu"]]:
            argv += ["--gpus", "all"]
        else:
            raise EngineError(f"docker run: the device request {dict(request)} has no --gpus form in builder")
    return argv


def _device(value: str) -> str:
    """A device as docker-py gives it (``/dev/kfd:/dev/kfd:rwm``) as the CLIs take it: the path alone where it is
    the same inside, with every permission (the CLIs' default)."""
    path, _, rest = str(value).partition(":")
    return path if rest in ("", f"{path}:rwm") else str(value)


def _docker_env(value: Mapping[str, str] | Sequence[str]) -> list[str]:
    entries = list(value) if not isinstance(value, Mapping) else [f"{k}={v}" for k, v in value.items()]
    if bare := [entry for entry in entries if "=" not in entry]:
        raise EngineError(f"docker run: no form to unset {', '.join(bare)} (docker run -e NAME passes the host's)")
    return [arg for entry in entries for arg in ("--env", entry)]


#: docker-py ``containers.create`` options as ``docker run`` arguments (builder itself runs Docker's containers
#: by its API; this is the line ``builder run --dry-run`` prints).
RUN_FLAGS: dict[str, Callable[[Any], list[str]]] = {
    "environment": _docker_env,
    "tmpfs": lambda value: [a for path, how in value.items() for a in ("--tmpfs", f"{path}:{how}" if how else path)],
    "network_mode": lambda value: ["--network", str(value)],
    "entrypoint": lambda value: ["--entrypoint", json.dumps(list(value)) if isinstance(value, list) else str(value)],
    "labels": lambda value: [a for k, v in value.items() for a in ("--label", f"{k}={v}")],
    "device_requests": _docker_gpus,
    "devices": lambda value: [a for v in value for a in ("--device", _device(v))],
    "group_add": lambda value: [a for v in value for a in ("--group-add", str(v))],
    "security_opt": lambda value: [a for v in value for a in ("--security-opt", str(v))],
    "ipc_mode": lambda value: ["--ipc", str(value)],
    "shm_size": lambda value: ["--shm-size", str(value)],
    "user": lambda value: ["--user", str(value)],
    "mounts": lambda value: [a for m in value for a in (
        "--mount", f"type={m['Type']},source={m['Source']},target={m['Target']}{',ro' if m.get('ReadOnly') else ''}")],
    "working_dir": lambda value: ["--workdir", str(value)],
}


def cli_args(flags: Mapping[str, Callable[[Any], list[str]]], options: Mapping[str, Any], what: str) -> list[str]:
    """The arguments of *flags* for docker-py *options*, then the image and the command; an option with no such
    form is refused rather than dropped."""
    argv = []
    for key, value in options.items():
        if key in ("image", "command") or value in (None, False, [], {}):
            continue
        if key not in flags:
            raise EngineError(f"{what}: the option {key} has no CLI form in builder; it would be dropped")
        argv += flags[key](value)
    return [*argv, str(options["image"]), *[str(c) for c in options.get("command") or []]]
