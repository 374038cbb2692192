"""The cluster commands: ``builder slurm`` (an sbatch script) and ``builder k8s`` (manifests).

Thin layers over :mod:`builder.cluster.slurm` and :mod:`builder.cluster.k8s`; added to the
group in ``builder/cli/__init__.py``.

Example:
    $ builder slurm -t cpu --nodes 2 -- /opt/examples/train.py --epochs 20
    $ builder slurm -t nvidia-cu130 --nodes 4 --gpus-per-node 8 --submit -- train.py
    $ builder k8s -t nvidia-cu130 --nodes 2 --gpus 8 | kubectl apply -f -
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from builder.cli.options import project_options
from builder.config.project import Project

_launcher_option = click.option(
    "--launcher", type=click.Choice(["accelerate", "torchrun"]), default="accelerate", show_default=True,
    help="What starts each node's processes and joins the rendezvous inside the container.",
)
_env_option = click.option(
    "--env", "-e", "env", multiple=True, metavar="K=V", help="Set a variable in every container (repeatable).",
)
_target_option = click.option("--target", "-t", "target", required=True, metavar="T", help="The target to run.")


@click.command(
    "slurm", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@project_options
@_target_option
@click.option("--nodes", "-N", default=1, show_default=True, type=int, help="Nodes to allocate (one container each).")
@click.option("--gpus-per-node", type=int, default=None,
              help="GPUs per node (#SBATCH --gpus-per-node); default 1 for a GPU target, none for cpu.")
@click.option("--procs-per-node", type=int, default=None,
              help="Processes per node; default one per GPU (cpu: 1).")
@_launcher_option
@click.option("--runtime", type=click.Choice(["docker", "podman", "pyxis"]), default="docker", show_default=True,
              help="docker: docker run on each node; podman: podman run (GPUs by CDI name; rootless keeps the "
              "user's IDs and groups); pyxis: srun --container-image (NVIDIA clusters with pyxis + enroot; checked "
              "here only by its arguments).")
@click.option("--job-name", "-J", default=None, help="Slurm job name; default <target>-train.")
@click.option("--partition", "-p", default=None, help="Slurm partition (#SBATCH --partition).")
@click.option("--time", default=None, help="Time limit (#SBATCH --time), e.g. 2:00:00.")
@click.option("--output", "job_output", default=None, metavar="PATTERN",
              help="The job's log (#SBATCH --output), e.g. logs/%x-%j.out; default Slurm's slurm-%j.out.")
@_env_option
@click.option("--script", "-o", "script", default="slurm", show_default=True, type=click.Path(),
              help="Where to write the script: a file with a suffix (job.sbatch), else a folder for <job name>.sbatch.")
@click.option("--submit", is_flag=True, help="Submit the script with sbatch (else print the sbatch line).")
@click.option("--wait", is_flag=True,
              help="With --submit: wait for the job to end and exit with its status (the training's).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def slurm_cmd(
    project: Project, target: str, nodes: int, gpus_per_node: int | None, procs_per_node: int | None,
    launcher: str, runtime: str, job_name: str | None, partition: str | None, time: str | None,
    job_output: str | None, env: tuple[str, ...], script: str, submit: bool, wait: bool, command: tuple[str, ...],
) -> None:
    """Write an sbatch script that runs COMMAND (a training script) in the target's image on every node.

    Each node starts one container with the vendor's device flags; the launcher inside it
    joins the rendezvous (MASTER_ADDR: the first node, MASTER_PORT: a free port there). The
    job's exit status is the training's; scancel stops and removes the containers.
    """
    from builder.cluster import slurm

    job = slurm.make_job(
        project, target, command, nodes=nodes, gpus_per_node=gpus_per_node, procs_per_node=procs_per_node,
        launcher=launcher, runtime=runtime, job_name=job_name, partition=partition, time=time, output=job_output,
        env=env,
    )
    path = slurm.write_script(job, Path(script))
    click.echo(f"wrote {path} ({job.target.name} on {job.nodes} node(s), image {job.image})", err=True)
    if not submit:
        if wait:
            click.echo("note: --wait works with --submit only", err=True)
        click.echo(shlex.join(slurm.sbatch_argv(path)))
        return
    sys.exit(slurm.submit(path, wait=wait))


@click.command("k8s", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@project_options
@_target_option
@click.option("--nodes", "-N", default=1, show_default=True, type=int,
              help="Pods (one per node): 1 gives a Job; more an indexed Job + headless Service.")
@click.option("--gpus", "-g", type=int, default=None, help="GPUs per pod; default 1 for a GPU target, none for cpu.")
@click.option("--gpu-resource", default=None,
              type=click.Choice(["nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe"]),
              help="The device plugin's resource name; default: the target's k8s_resource in matrix.yaml, else "
              "the vendor's (nvidia.com/gpu, amd.com/gpu, gpu.intel.com/i915).")
@click.option("--name", default=None, help="Job (and Service) name; default <target>-train.")
@click.option("--namespace", "-n", default=None, help="metadata.namespace of every manifest.")
@_launcher_option
@click.option("--grace-period", type=int, default=300, show_default=True,
              help="terminationGracePeriodSeconds: time between SIGTERM and SIGKILL to write a checkpoint.")
@_env_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def k8s_cmd(
    project: Project, target: str, nodes: int, gpus: int | None, gpu_resource: str | None, name: str | None,
    namespace: str | None, launcher: str, grace_period: int, env: tuple[str, ...], command: tuple[str, ...],
) -> None:
    """Print Kubernetes manifests that run COMMAND (default: the image's example training) on N nodes.

    Pipe them to kubectl apply -f -. The image is named by digest once builder build --push
    has published it (dist/published.json).
    """
    from builder.cluster import k8s

    docs = k8s.manifests(
        project, target, command or k8s.DEFAULT_COMMAND, nodes=nodes, gpus=gpus, gpu_resource_name=gpu_resource,
        name=name, namespace=namespace, launcher=launcher, grace=grace_period, env=env,
    )
    click.echo(k8s.dump(docs), nl=False)
