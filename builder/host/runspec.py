"""``builder run``'s plan: image, command, environment, user and devices, worked out without the engine.

The container gets the target vendor's device flags (:mod:`builder.host.devices`), the current
directory bound at ``/workspace`` (read-write) and single-process ``torch.distributed``
variables. The image's ENTRYPOINT (the runtime contract checker) stays; the command replaces CMD.

The container runs as the invoking user's UID:GID when that user is not root (``--user
auto``), so what the job writes to ``/workspace`` belongs to the user on the host; the image's
contract checker gives a UID without a home a private, writable ``HOME``. Root, or
``--user image``, keeps the image's user (uid 1001); ``--user UID[:GID]`` picks another.

Example:
    >>> plan = run_spec(project, ["python", "train.py"])  # doctest: +SKIP
    >>> print(format_dry_run(plan))  # doctest: +SKIP
    # target: nvidia-cu130 (localhost:5000/ml-runtime:nvidia-cu130)
    # why: host has usable nvidia GPU(s): 0000:01:00.0 (0x2335); nvidia-cu130 carries latest-nvidia
    docker run --rm --label io.ml-image-builder.run=1 ... --gpus all --shm-size 8g ... python train.py

The dry run's line is the engine's own (``docker run`` or ``podman run``), from the same options the real run
gives the engine (:func:`builder.oci.connect.run_argv`): on podman, NVIDIA's GPUs by CDI name
(``--device nvidia.com/gpu=all``), and ``--userns keep-id`` where a rootless podman runs the user's UID.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.config.errors import UserError
from builder.config.project import LABEL_PREFIX, Project, Target
from builder.host import hardware
from builder.host.devices import device_flags, device_kwargs, host_cdi
from builder.host.targets import choose_target
from builder.oci.connect import run_argv
from builder.oci.docker import Mount
from builder.oci.engine import EngineFacts

WORKSPACE = "/workspace"
#: One process on one machine; a launcher on the host (torchrun, Slurm) may set its own.
DIST_DEFAULTS = {
    "WORLD_SIZE": "1",
    "RANK": "0",
    "LOCAL_RANK": "0",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}
#: On every container builder run starts; image labels are inherited, hence a ``run.`` namespace.
RUN_LABEL = f"{LABEL_PREFIX}.run"


@dataclass(frozen=True)
class RunSpec:
    """Everything ``builder run`` will do, before it talks to the engine."""

    target: Target
    reason: str
    image: str
    command: tuple[str, ...]
    environment: dict[str, str]
    workspace: str
    gpus: bool = False
    devices: tuple[str, ...] = ()
    group_add: tuple[int | str, ...] = ()  # GIDs, or podman's keep-groups
    ipc_mode: str | None = None
    shm_size: str | None = None
    user: str | None = None  # UID:GID, or None for the image's user
    labels: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    cdi_devices: tuple[str, ...] = ()  # CDI names (nvidia.com/gpu=all) instead of --gpus / /dev nodes
    security_opt: tuple[str, ...] = ()
    engine: str = "docker"  # the engine planned for: docker or podman

    def create_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for docker-py's ``containers.create`` (in the order the command line gives them)."""
        return {
            "image": self.image,
            "command": list(self.command),
            "labels": dict(self.labels),
            **device_kwargs(self.gpus, self.devices, self.group_add, self.ipc_mode, self.shm_size,
                            self.cdi_devices, self.security_opt),
            **({"user": self.user} if self.user else {}),
            "mounts": [Mount(WORKSPACE, self.workspace, type="bind", read_only=False)],
            "working_dir": WORKSPACE,
            "environment": dict(self.environment),
            "stdin_open": False,
            "tty": False,
        }

    def argv(self) -> list[str]:
        """The engine's own command line (``docker run`` / ``podman run``) that runs what ``builder run`` runs."""
        return run_argv(self.engine, self.create_kwargs())

def parse_env(pairs: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """``--env K=V`` values; a bare ``K`` takes the host's value, like ``docker run -e K``.

    Example:
        >>> parse_env(["A=1", "HOME"], {"HOME": "/root"})
        {'A': '1', 'HOME': '/root'}
    """
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not key or any(c.isspace() for c in key):
            raise UserError(f"--env {pair!r}: expected KEY=VALUE (or KEY to pass the host's value)")
        if not sep:
            if key not in environ:
                raise UserError(f"--env {key}: not set on the host; give a value with --env {key}=VALUE")
            value = environ[key]
        out[key] = value
    return out

def container_env(target: Target, pairs: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """Distributed defaults (host values win), the host's device selection variable, then ``--env``.

    Example:
        >>> container_env(cpu_target, ["SEED=1"], {"MASTER_PORT": "29600"})["MASTER_PORT"]
        '29600'
    """
    env = {key: environ.get(key, default) for key, default in DIST_DEFAULTS.items()}
    if target.visible_devices_env and target.visible_devices_env in environ:
        env[target.visible_devices_env] = environ[target.visible_devices_env]  # the host picked devices
    env.update(parse_env(pairs, environ))
    return env

def container_user(choice: str, uid: int | None = None, gid: int | None = None) -> str | None:
    """The container's ``UID:GID`` for ``--user``; None keeps the image's user (1001).

    ``auto``: the invoking user's, unless that is root; ``image``: the image's; else UID[:GID].

    Example:
        >>> container_user("auto", 1000, 1000), container_user("auto", 0, 0), container_user("4242")
        ('1000:1000', None, '4242:4242')
    """
    uid = os.getuid() if uid is None else uid
    gid = os.getgid() if gid is None else gid
    if choice == "image":
        return None
    if choice == "auto":
        return None if uid == 0 else f"{uid}:{gid}"
    user, _, group = choice.partition(":")
    if not user.isdigit() or not (group or user).isdigit():
        raise UserError(f"--user {choice!r}: give auto, image, or a numeric UID[:GID] such as 1000:1000")
    return f"{user}:{group or user}"

def run_spec(
    project: Project,
    command: Sequence[str],
    *,
    target: str = "auto",
    user: str = "auto",
    gpus: bool = True,
    env: Sequence[str] = (),
    host: hardware.HostGpus | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    engine_info: Callable[[], EngineFacts | None] | None = None,
    cdi_dirs: Iterable[Path | str] = hardware.CDI_DIRS,
    engine: str = "docker",
) -> RunSpec:
    """Work out the whole run for *engine* (``docker`` or ``podman``) without touching it.

    *engine_info* (the engine's facts, called only when the host has a CDI spec for the target's
    vendor and the engine is Docker) decides whether the GPUs go by CDI name
    (:func:`builder.host.devices.host_cdi`; podman always reads the specs).

    Example:
        >>> run_spec(project, ["python", "-V"], target="cpu").image
        'localhost:5000/ml-runtime:cpu'
    """
    if not command:
        raise UserError("no command given; write it after '--', e.g. builder run -- python train.py")
    environ = os.environ if environ is None else environ
    host = host or hardware.detect()
    chosen, reason = choose_target(project, target, host, gpus=gpus, environ=environ)
    cdi = host_cdi(chosen.vendor, engine_info, cdi_dirs, engine) if gpus and chosen.vendor != "cpu" else None
    # rootless: the podman CLI this user runs (the dry run's line, and builder run's own CLI create)
    flags = device_flags(chosen, host, gpus=gpus, environ=environ, cdi=cdi, engine=engine, rootless=os.geteuid() != 0)
    return RunSpec(
        target=chosen,
        reason=reason,
        image=chosen.primary_ref,
        command=tuple(command),
        environment=container_env(chosen, env, environ),
        workspace=str(Path(cwd or os.getcwd()).resolve()),
        gpus=flags.gpus,
        devices=flags.devices,
        group_add=flags.group_add,
        ipc_mode=flags.ipc_mode,
        shm_size=flags.shm_size,
        user=container_user(user),
        labels={RUN_LABEL: "1", f"{RUN_LABEL}.target": chosen.name, f"{RUN_LABEL}.image": chosen.primary_ref},
        notes=flags.notes,
        problems=flags.problems,
        cdi_devices=flags.cdi_devices,
        security_opt=flags.security_opt,
        engine=engine,
    )

def format_dry_run(plan: RunSpec) -> str:
    """The target, why, notes and the engine's shell-quoted ``run`` line; ``#`` lines keep it runnable by sh."""
    lines = [f"# target: {plan.target.name} ({plan.image})", f"# why: {plan.reason}"]
    lines += [f"# note: {note}" for note in plan.notes]
    lines += [f"# problem: {problem}" for problem in plan.problems]
    return "\n".join([*lines, shlex.join(plan.argv())])
