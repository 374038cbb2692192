"""``builder run``: run a command in the image that fits this host's GPUs.

The target: ``--target T``, or with ``auto`` the matrix target of the host's vendor
(:func:`builder.hostdetect.choose_vendor`); when several targets share the vendor, the one
tagged ``latest-<vendor>``; with no usable GPU (or ``--no-gpus``) the cpu target.

The container gets the vendor's device flags from wheel-mapping.json (``run``): NVIDIA all
GPUs (a ``DeviceRequest``, ``--gpus all``); AMD ``/dev/kfd`` and ``/dev/dri``, the host GIDs
of ``video``/``render`` and of the nodes' owning groups, ``--ipc host``; Intel ``/dev/dri`` and
groups. Also ``--shm-size``, the current directory bound at ``/workspace`` (read-write) and
single-process ``torch.distributed`` variables. The image's ENTRYPOINT (the runtime contract
checker) stays; the command replaces CMD.

The container runs as the invoking user's UID:GID when that user is not root (``--user
auto``), so what the job writes to ``/workspace`` belongs to the user on the host; the image's
contract checker gives a UID without a home a private, writable ``HOME``. Root, or
``--user image``, keeps the image's user (uid 1001); ``--user UID[:GID]`` picks another.
stdin is not forwarded: this runs batch commands, not interactive shells.

Example:
    >>> plan = build_plan(project, ["python", "train.py"])
    >>> print(format_dry_run(plan))
    # target: nvidia-cu130 (localhost:5000/ml-runtime:nvidia-cu130)
    # why: host has usable nvidia GPU(s): 0000:01:00.0 (0x2335); nvidia-cu130 carries latest-nvidia
    docker run --rm --label io.ml-image-builder.run=1 ... --gpus all --shm-size 8g ... python train.py
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import docker
import docker.types
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from builder import hostdetect, registry
from builder.errors import UserError
from builder.project import LABEL_PREFIX, Project, ResolvedTarget

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
#: Seconds a container gets between SIGTERM and SIGKILL after Ctrl-C.
STOP_TIMEOUT_S = 10


@dataclass(frozen=True)
class RunPlan:
    """Everything ``builder run`` will do, before it talks to the engine."""

    target: ResolvedTarget
    reason: str
    image: str
    command: tuple[str, ...]
    environment: dict[str, str]
    workspace: str
    gpus: bool = False
    devices: tuple[str, ...] = ()
    group_add: tuple[int, ...] = ()
    ipc_mode: str | None = None
    shm_size: str | None = None
    user: str | None = None  # UID:GID, or None for the image's user
    labels: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()

    def create_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for docker-py's ``containers.create``."""
        return {
            "image": self.image,
            "command": list(self.command),
            "environment": dict(self.environment),
            "labels": dict(self.labels),
            "mounts": [docker.types.Mount(WORKSPACE, self.workspace, type="bind", read_only=False)],
            "working_dir": WORKSPACE,
            **({"user": self.user} if self.user else {}),
            **device_kwargs(self.gpus, self.devices, self.group_add, self.ipc_mode, self.shm_size),
            "stdin_open": False,
            "tty": False,
        }

    def docker_argv(self) -> list[str]:
        """The equivalent ``docker run`` command line, as an argument list."""
        argv = ["docker", "run", "--rm"]
        for key, value in self.labels.items():
            argv += ["--label", f"{key}={value}"]
        if self.gpus:
            argv += ["--gpus", "all"]
        for device in self.devices:
            argv += ["--device", device]
        for gid in self.group_add:
            argv += ["--group-add", str(gid)]
        if self.ipc_mode:
            argv += ["--ipc", self.ipc_mode]
        if self.shm_size:
            argv += ["--shm-size", self.shm_size]
        if self.user:
            argv += ["--user", self.user]
        argv += ["--mount", f"type=bind,source={self.workspace},target={WORKSPACE}", "--workdir", WORKSPACE]
        for key, value in self.environment.items():
            argv += ["--env", f"{key}={value}"]
        return [*argv, self.image, *self.command]


def choose_target(
    project: Project,
    requested: str = "auto",
    host: hostdetect.HostGpus | None = None,
    *,
    gpus: bool = True,
    environ: Mapping[str, str] | None = None,
) -> tuple[ResolvedTarget, str]:
    """The target to run and why (see the module docstring for the rule).

    Example:
        >>> choose_target(project, "auto", hostdetect.HostGpus())
        (ResolvedTarget(name='cpu', ...), 'no usable GPU on this host')
    """
    if requested != "auto":
        return project.target(requested), f"--target {requested}"
    if gpus:
        vendor, why = hostdetect.choose_vendor(host or hostdetect.detect(), environ)
    else:
        vendor, why = "cpu", "--no-gpus"
    candidates = [t for t in project.targets if t.vendor == vendor]
    if not candidates and vendor != "cpu":
        why += f"; {project.matrix_path.name} has no {vendor} target, so the cpu one"
        vendor, candidates = "cpu", [t for t in project.targets if t.vendor == "cpu"]
    if not candidates:
        raise UserError(
            f"{project.matrix_path.name}: no {vendor} target to run here; add one (backend: {vendor}) "
            "or pass --target T"
        )
    if len(candidates) == 1:
        return candidates[0], why
    latest = [t for t in candidates if t.alias_refs] or candidates
    return latest[
        0
    ], why + f"; {latest[0].name} carries latest-{vendor} (of {', '.join(t.name for t in candidates)})"


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


def container_env(target: ResolvedTarget, pairs: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
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


def device_kwargs(
    gpus: bool, devices: Sequence[str], group_add: Sequence[int], ipc_mode: str | None, shm_size: str | None
) -> dict[str, Any]:
    """docker-py ``containers.create`` options that hand a container its GPUs.

    Example:
        >>> device_kwargs(True, (), (), None, "8g")["device_requests"][0]["Capabilities"]
        [['gpu']]
    """
    return {
        "device_requests": [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])] if gpus else None,
        "devices": [f"{d}:{d}:rwm" for d in devices] or None,
        "group_add": [str(g) for g in group_add] or None,
        "ipc_mode": ipc_mode,
        "shm_size": shm_size,
    }


@dataclass(frozen=True)
class DeviceFlags:
    """A vendor's device flags worked out for this host."""

    gpus: bool = False
    devices: tuple[str, ...] = ()
    group_add: tuple[int, ...] = ()
    ipc_mode: str | None = None
    shm_size: str | None = None
    notes: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()

    def docker_kwargs(self) -> dict[str, Any]:
        return device_kwargs(self.gpus, self.devices, self.group_add, self.ipc_mode, self.shm_size)


def device_flags(
    target: ResolvedTarget,
    host: hostdetect.HostGpus,
    *,
    gpus: bool = True,
    environ: Mapping[str, str] | None = None,
) -> DeviceFlags:
    """The target vendor's ``run`` flags, with group names turned into this host's GIDs.

    *problems* are reasons the engine would refuse (a missing node, no GPU of the vendor);
    ``builder run`` stops on them, ``--dry-run`` shows them.

    Example:
        >>> device_flags(amd_target, hostdetect.detect()).devices
        ('/dev/kfd', '/dev/dri')
    """
    environ = os.environ if environ is None else environ
    flags = target.run_flags
    if not gpus or target.vendor == "cpu":
        notes = (
            (f"--no-gpus: running the {target.vendor} image without its devices",)
            if target.vendor != "cpu"
            else ()
        )
        return DeviceFlags(shm_size=flags.shm_size, notes=notes)
    notes, problems = [], []
    forced = environ.get(hostdetect.VENDOR_ENV, "").strip().lower() == target.vendor
    if target.vendor not in host.usable() and not forced:
        found = host.describe(target.vendor)
        lack = "; ".join(host.missing(target.vendor)) if found else "no such GPU on the PCI bus"
        problems.append(
            f"target {target.name} needs a usable {target.vendor} GPU and this host has none ({lack}); "
            f"pass --no-gpus to run it without GPUs, or --target auto"
        )
    for device in flags.devices:
        if not host.nodes.host_path(device).exists():
            problems.append(
                f"{device}: missing on this host; load the {target.vendor} driver, or pass --no-gpus"
            )
    gids: tuple[int, ...] = ()
    if flags.group_add:
        known = hostdetect.group_gids(flags.group_add)
        notes += [
            f"host has no {name!r} group; relying on the device nodes' groups"
            for name in flags.group_add
            if name not in known
        ]
        gids = tuple(hostdetect.container_gids(flags.group_add, host.nodes))
    return DeviceFlags(
        gpus=flags.gpus,
        devices=tuple(flags.devices),
        group_add=gids,
        # With host IPC the host's /dev/shm is used and --shm-size has no effect; kept as the guides give it.
        ipc_mode="host" if flags.ipc_host else None,
        shm_size=flags.shm_size,
        notes=tuple(notes),
        problems=tuple(problems),
    )


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


def build_plan(
    project: Project,
    command: Sequence[str],
    *,
    target: str = "auto",
    user: str = "auto",
    gpus: bool = True,
    env: Sequence[str] = (),
    host: hostdetect.HostGpus | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
) -> RunPlan:
    """Work out the whole run without touching the engine.

    Example:
        >>> build_plan(project, ["python", "-V"], target="cpu").image
        'localhost:5000/ml-runtime:cpu'
    """
    if not command:
        raise UserError("no command given; write it after '--', e.g. builder run -- python train.py")
    environ = os.environ if environ is None else environ
    host = host or hostdetect.detect()
    chosen, reason = choose_target(project, target, host, gpus=gpus, environ=environ)
    flags = device_flags(chosen, host, gpus=gpus, environ=environ)
    return RunPlan(
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
    )


def format_dry_run(plan: RunPlan) -> str:
    """The target, why, notes and the shell-quoted ``docker run`` line; ``#`` lines keep it runnable by sh."""
    lines = [f"# target: {plan.target.name} ({plan.image})", f"# why: {plan.reason}"]
    lines += [f"# note: {note}" for note in plan.notes]
    lines += [f"# problem: {problem}" for problem in plan.problems]
    return "\n".join([*lines, shlex.join(plan.docker_argv())])


def ensure_image(client: docker.DockerClient, plan: RunPlan) -> str | None:
    """Make sure the image is here: pull it if not. Returns a line when it pulled.

    Example:
        >>> ensure_image(connect(), plan)
        'pulled localhost:5000/ml-runtime:cpu'
    """
    try:
        client.images.get(plan.image)
        return None
    except ImageNotFound:
        pass
    ref = registry.Ref.parse(plan.image)
    try:
        client.images.pull(ref.name, tag=ref.tag, auth_config=registry.credentials(ref.host))
    except DockerException as exc:
        reason = (getattr(exc, "explanation", None) or str(exc)).strip().splitlines()[0][:200]
        raise UserError(
            f"image {plan.image} is not here and pulling it failed ({reason}); "
            f"build it with 'make images TARGETS={plan.target.name}'"
        ) from None
    return f"pulled {plan.image}"


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt, so a killed ``builder run`` still cleans up."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _shielded() -> Iterator[None]:
    """Hold off Ctrl-C and SIGTERM while the container is stopped and removed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _start_error(plan: RunPlan, exc: APIError) -> UserError:
    text = (exc.explanation or str(exc)).strip().splitlines()[0][:300]
    if "could not select device driver" in text:
        return UserError(
            f"the engine cannot give GPUs to {plan.image} ({text}); install nvidia-container-toolkit, then "
            "'nvidia-ctk runtime configure --runtime=docker && systemctl restart docker' "
            "(builder doctor checks this)"
        )
    return UserError(f"the engine could not start {plan.image}: {text}")


def run_container(
    client: docker.DockerClient,
    plan: RunPlan,
    *,
    stdout: BinaryIO | None = None,
    stderr: BinaryIO | None = None,
    stop_timeout: int = STOP_TIMEOUT_S,
) -> int:
    """Run the plan, streaming the container's stdout and stderr as they come; return its exit status.

    The container is always removed, also after Ctrl-C or SIGTERM (stopped first, then the
    KeyboardInterrupt goes on).

    Example:
        >>> run_container(connect(), build_plan(project, ["sh", "-c", "exit 7"], target="cpu"))
        7
    """
    stdout = stdout or sys.stdout.buffer
    stderr = stderr or sys.stderr.buffer
    container = None
    try:
        with _interruptible():
            try:
                container = client.containers.create(**plan.create_kwargs())
                # Attach before start (logs=True as well) so not a byte of early output is lost.
                stream = client.api.attach(
                    container.id, stdout=True, stderr=True, stream=True, logs=True, demux=True
                )
                container.start()
            except APIError as exc:
                raise _start_error(plan, exc) from None
            try:
                for out, err in stream:
                    for chunk, sink in ((out, stdout), (err, stderr)):
                        if chunk:
                            sink.write(chunk)
                            sink.flush()
                return int(container.wait()["StatusCode"])
            except KeyboardInterrupt:
                with _shielded():
                    # A closed terminal must not keep the container from being stopped.
                    with contextlib.suppress(OSError, ValueError):
                        stderr.write(
                            f"builder run: interrupted; stopping the container (<= {stop_timeout} s)\n".encode()
                        )
                        stderr.flush()
                    with contextlib.suppress(NotFound, APIError):
                        container.stop(timeout=stop_timeout)
                raise
    finally:
        if container is not None:
            with _shielded(), contextlib.suppress(NotFound, APIError):
                container.remove(force=True)


def launch(
    plan: RunPlan,
    *,
    client: docker.DockerClient | None = None,
    say: Callable[[str], object] | None = None,
    stop_timeout: int = STOP_TIMEOUT_S,
) -> int:
    """Refuse on plan problems, make sure the image is here, run; return the command's exit status.

    *client* defaults to :func:`builder.engine.connect` (after the plan checks, so a bad plan
    is reported even without an engine); *say* gets progress lines, default stderr.

    Example:
        >>> launch(build_plan(project, ["python", "-c", "raise SystemExit(3)"]))
        3
    """
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    if plan.problems:
        raise UserError(*plan.problems)
    if client is None:
        from builder.engine import connect

        client = connect()
    say(f"builder run: {plan.target.name} ({plan.image}): {plan.reason}")
    for note in plan.notes:
        say(f"note: {note}")
    pulled = ensure_image(client, plan)
    if pulled:
        say(pulled)
    return run_container(client, plan, stop_timeout=stop_timeout)
