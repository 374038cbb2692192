"""``builder slurm``: an sbatch script that runs a target's image on every node of a Slurm allocation.

Each node runs one container of the image (``docker run``, or ``podman run`` with
``runtime="podman"``: the vendor's device flags for that engine from :mod:`builder.host.devices`,
host networking for the rendezvous); inside it, the launcher
(:func:`builder.cluster.common.launcher_argv`) starts the node's processes. The script sets
``MASTER_ADDR`` (the first node's address), ``MASTER_PORT`` (free there), ``WORLD_SIZE``,
``NODE_RANK``/``RANK`` (``SLURM_NODEID``/``SLURM_PROCID``). The job's exit status is the
training's; ``scancel`` stops and removes the containers. ``runtime="pyxis"`` writes the NVIDIA
cluster variant instead: ``srun --container-image`` (pyxis + enroot), no docker on the nodes.

Every value from the user is checked (names, times, partitions: they go into ``#SBATCH``
lines) and shell-quoted (the image, the command, ``--env`` values).

Example:
    >>> job = make_job(project, "cpu", ["/opt/examples/train.py"], nodes=2)
    >>> path = write_script(job, Path("slurm"))
    >>> sbatch_argv(path)
    ['sbatch', 'slurm/cpu-train.sbatch']
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import jinja2

from builder.cluster.common import (
    LAUNCHERS,
    Launcher,
    check_env,
    image_reference,
    launcher_argv,
    script_words,
    shell_words,
    target_env,
)
from builder.config.errors import UserError
from builder.config.files import atomic_write
from builder.config.ownership import REFERENCES, Ledger
from builder.config.project import LABEL_PREFIX, Project, Target
from builder.host.devices import NodeDevices, node_devices
from builder.oci import registry
from builder.oci.secrets import ALL, child_env

Runtime = Literal["docker", "podman", "pyxis"]
RUNTIMES: tuple[Runtime, ...] = ("docker", "podman", "pyxis")
#: Seconds ``docker stop`` gives the training after scancel: below Slurm's default KillWait (30 s),
#: after which slurmstepd kills what is left (the docker client, never the container itself).
STOP_GRACE_S = 20
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
PARTITION = re.compile(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*")
#: Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}")
OUTPUT = re.compile(r"[A-Za-z0-9_./%-]+")
MAX_NODES, MAX_GPUS = 4096, 64
#: On every container the script starts; the value is the job ID.
SLURM_LABEL = f"{LABEL_PREFIX}.slurm.job"


@dataclass(frozen=True)
class SlurmJob:
    """Everything the sbatch script says, checked."""

    target: Target
    image: str
    image_source: str
    command: tuple[str, ...]
    nodes: int
    gpus_per_node: int
    procs_per_node: int
    launcher: Launcher = "accelerate"
    runtime: Runtime = "docker"
    job_name: str = "train"
    partition: str | None = None
    time: str | None = None
    output: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    devices: NodeDevices = field(default_factory=NodeDevices)
    grace: int = STOP_GRACE_S


def _check(value: str | None, pattern: re.Pattern[str], option: str, example: str) -> str | None:
    if value is not None and not pattern.fullmatch(value):
        raise UserError(f"{option} {value!r}: not allowed in an #SBATCH line; use something like {example}")
    return value


def make_job(
    project: Project,
    target: str,
    command: Sequence[str],
    *,
    nodes: int = 1,
    gpus_per_node: int | None = None,
    procs_per_node: int | None = None,
    launcher: str = "accelerate",
    runtime: str = "docker",
    job_name: str | None = None,
    partition: str | None = None,
    time: str | None = None,
    output: str | None = None,
    env: Sequence[str] = (),
) -> SlurmJob:
    """Check the request and work out the job (no file written, nothing submitted).

    GPU targets default to one GPU per node and one process per GPU; the cpu target to one
    process per node and no GPU.

    Example:
        >>> make_job(project, "nvidia-cu130", ["train.py"], nodes=4, gpus_per_node=8).procs_per_node
        8
    """
    chosen = project.target(target)
    if not command:
        raise UserError("no command given; write it after '--', e.g. builder slurm -t cpu -- /opt/examples/train.py")
    if not 1 <= nodes <= MAX_NODES:
        raise UserError(f"--nodes {nodes}: give 1 to {MAX_NODES}")
    if chosen.vendor == "cpu":
        if gpus_per_node:
            raise UserError(f"--gpus-per-node {gpus_per_node}: target {target} is a cpu image; leave it out "
                            "or pick a GPU target")
        gpus = 0
    else:
        gpus = 1 if gpus_per_node is None else gpus_per_node
        if not 1 <= gpus <= MAX_GPUS:
            raise UserError(f"--gpus-per-node {gpus}: a {chosen.vendor} target needs 1 to {MAX_GPUS}")
    procs = procs_per_node if procs_per_node is not None else max(gpus, 1)
    if not 1 <= procs <= 1024:
        raise UserError(f"--procs-per-node {procs}: give 1 to 1024")
    if launcher not in LAUNCHERS:
        raise UserError(f"--launcher {launcher!r}: use one of {', '.join(LAUNCHERS)}")
    if runtime not in RUNTIMES:
        raise UserError(f"--runtime {runtime!r}: use one of {', '.join(RUNTIMES)}")
    if runtime == "pyxis" and chosen.vendor not in ("nvidia", "cpu"):
        raise UserError(f"--runtime pyxis: enroot hands out NVIDIA GPUs only; target {target} is {chosen.vendor}: "
                        "use --runtime docker")
    name = job_name or f"{chosen.name}-train"
    _check(name, JOB_NAME, "--job-name", "cpu-train")
    _check(partition, PARTITION, "--partition", "gpu")
    _check(time, TIME, "--time", "2:00:00 or 1-12:00:00")
    _check(output, OUTPUT, "--output", "logs/%x-%j.out")
    image, source = image_reference(project, chosen)
    if runtime == "pyxis":
        image, source = chosen.primary_ref, "tag: enroot URIs name a tag"
    # Checked before the script is written: a bad script would fail on the nodes, later.
    launcher_argv(launcher, command, nodes=nodes, procs_per_node=procs)
    return SlurmJob(
        target=chosen, image=image, image_source=source, command=tuple(command), nodes=nodes,
        gpus_per_node=gpus, procs_per_node=procs, launcher=launcher,
        runtime=runtime, job_name=name, partition=partition, time=time,
        output=output, env=target_env(chosen, check_env(env)),
        devices=node_devices(chosen, engine="podman" if runtime == "podman" else "docker"),
    )


def enroot_uri(reference: str) -> str:
    """An image reference as pyxis/enroot names it: ``REGISTRY#IMAGE:TAG``.

    Example:
        >>> enroot_uri("localhost:5000/ml-runtime:cpu")
        'localhost:5000#ml-runtime:cpu'
    """
    ref = registry.Ref.parse(reference)
    return f"{ref.host}#{ref.repository}" + (f":{ref.tag}" if ref.tag else "") + (f"@{ref.digest}" if ref.digest else "")


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("builder.cluster", "templates"), undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False,
    )


def render_script(job: SlurmJob, script_name: str = "job.sbatch") -> str:
    """The sbatch script's text.

    Example:
        >>> render_script(make_job(project, "cpu", ["train.py"], nodes=2)).splitlines()[0]
        '#!/bin/bash'
    """
    argv = launcher_argv(job.launcher, job.command, nodes=job.nodes, procs_per_node=job.procs_per_node)
    script = len(script_words(job.command))
    launch_line = shell_words(argv[:-script]) + " \\\n      " + shell_words(argv[-script:])
    quote = shlex.quote
    env_names = ["MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "RANK", *job.env]
    # As run_node does for docker: record a failure of this rank's own (not srun stopping it).
    inner = (f'export NODE_RANK="$SLURM_NODEID" RANK="$SLURM_PROCID"; t=0; '
             f'trap \'t=1; kill -TERM "$p" 2>/dev/null\' TERM INT; {shell_words(argv)} & p=$!; s=0; '
             'wait "$p" || s=$?; while kill -0 "$p" 2>/dev/null; do s=0; wait "$p" || s=$?; done; '
             'if [ "$s" != 0 ] && [ "$t" = 0 ]; then echo "$(date +%s%N) $SLURM_NODEID $s" '
             '> "/workspace/.builder-slurm-$SLURM_JOB_ID/$SLURM_NODEID"; fi; exit "$s"')
    return _environment().get_template("sbatch.sh.j2").render(
        target=job.target, nodes=job.nodes, image=job.image, image_q=quote(job.image), image_source=job.image_source,
        command_line=shlex.join(job.command), runtime=job.runtime, launcher=job.launcher,
        procs_per_node=job.procs_per_node, grace=job.grace, script_name=script_name, job_name=job.job_name,
        gpus_per_node=job.gpus_per_node, partition=job.partition, time=job.time, output=job.output,
        env_lines=[f"{k}={quote(v)}" for k, v in job.env.items()],
        env_flags=" ".join(f"--env {k}" for k in env_names),
        devices=job.devices, launch_line=launch_line, label=SLURM_LABEL,
        visible_env=job.target.visible_devices_env if job.devices.classic or job.devices.cdi_kind else None,
        enroot_image_q=quote(enroot_uri(job.image)), inner_q=quote(inner),
        no_cdi_q=quote(job.devices.no_cdi or ""),
        # podman pulls from a loopback registry only when told it speaks plain http (Docker assumes it)
        pull_flags="--tls-verify=false " if job.runtime == "podman" and registry.is_local(
            registry.Ref.parse(job.image).host) else "",
    )


def write_script(job: SlurmJob, path: Path) -> Path:
    """Write the script (mode 0755) to *path*, or into *path* as ``<job name>.sbatch`` when it is a folder;
    recorded (:data:`builder.config.ownership.REFERENCES`), so that ``builder gc`` keeps the local image
    it names by digest while the script is there.

    Example:
        >>> write_script(make_job(project, "cpu", ["train.py"], nodes=2), Path("slurm"))
        PosixPath('slurm/cpu-train.sbatch')
    """
    if path.is_dir() or not path.suffix:
        path = path / f"{job.job_name}.sbatch"
    atomic_write(path, render_script(job, path.name))
    path.chmod(0o755)
    Ledger(REFERENCES).record(str(path.resolve()), facts={"image": job.image})
    return path


def sbatch_argv(path: Path, *, wait: bool = False) -> list[str]:
    """The ``sbatch`` line that submits the script (``--wait``: return when the job ends, with its status).

    Example:
        >>> sbatch_argv(Path("slurm/cpu-train.sbatch"), wait=True)
        ['sbatch', '--wait', 'slurm/cpu-train.sbatch']
    """
    return ["sbatch", *(["--wait"] if wait else []), str(path)]


def submit(path: Path, *, wait: bool = False) -> int:
    """Run sbatch on the script (its output passes through); return sbatch's exit status.

    With *wait*, that is the job's exit status, i.e. the training's.

    Example:
        >>> submit(Path("slurm/cpu-train.sbatch"), wait=True)  # doctest: +SKIP
        0
    """
    try:
        return subprocess.run(sbatch_argv(path, wait=wait), check=False, env=child_env(ALL)).returncode
    except FileNotFoundError:
        raise UserError("sbatch: not found; run this on a Slurm login node, or leave out --submit and copy "
                        f"{path} there") from None
