"""``builder k8s``: Kubernetes manifests that run a target's image on one node or several.

One node: a ``batch/v1`` Job. N nodes: an indexed Job (``completionMode: Indexed``, N pods)
plus a headless Service for the rendezvous: pod *i* is ``<name>-<i>.<name>`` in DNS, so
``MASTER_ADDR`` is ``<name>-0.<name>`` and each pod's ``NODE_RANK`` is its completion index.

Every pod: the vendor's GPU resource in ``limits`` (``nvidia.com/gpu``, ``amd.com/gpu``,
``gpu.intel.com/i915`` or ``gpu.intel.com/xe``: ``--gpu-resource``, else the target's
``k8s_resource`` in matrix.yaml, else the vendor's default), ``runAsUser: 1001`` and
``runAsNonRoot``, a memory-backed ``emptyDir`` on ``/dev/shm`` (the size of ``builder run``'s
``--shm-size``), ``terminationGracePeriodSeconds`` for a checkpoint on SIGTERM (tini forwards
it), and the image by digest when ``dist/published.json`` records it.

The manifests are checked against the Kubernetes schemas (``kubernetes-validate``) for
:data:`K8S_VERSION` by the tests; no cluster runs them here.

Example:
    >>> docs = manifests(project, "nvidia-cu130", nodes=2, gpus=8)
    >>> [d["kind"] for d in docs]
    ['Service', 'Job']
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import yaml

from builder.cluster.common import (
    DEFAULT_PORT,
    LAUNCHERS,
    Launcher,
    Var,
    Word,
    check_env,
    image_reference,
    launcher_argv,
    target_env,
)
from builder.config.errors import UserError
from builder.config.project import LABEL_PREFIX, Project, Target

#: The Kubernetes release whose schemas the tests validate every manifest against.
K8S_VERSION = "1.33.0"
#: The resource each vendor's device plugin advertises, by default.
DEFAULT_RESOURCES = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu", "intel": "gpu.intel.com/i915"}
RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe")
#: Seconds between SIGTERM and SIGKILL: time to write a checkpoint.
GRACE_S = 300
#: The images' user (templates/Dockerfile.j2: USER 1001:1001).
IMAGE_UID = 1001
#: DNS-1123 label; an indexed Job's pods are ``<name>-<index>``, which must stay within 63 characters.
NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,48}[a-z0-9])?")
DEFAULT_COMMAND = ("/opt/examples/train.py",)


def gpu_resource(target: Target, override: str | None = None) -> str | None:
    """The resource name to put in limits: *override*, the matrix's ``k8s_resource``, the vendor's default.

    Example:
        >>> gpu_resource(project.target("intel-oneapi"), "gpu.intel.com/xe")
        'gpu.intel.com/xe'
    """
    if target.vendor == "cpu":
        if override:
            raise UserError(f"--gpu-resource {override}: target {target.name} is a cpu image; leave it out")
        return None
    resource = override or target.k8s_resource or DEFAULT_RESOURCES[target.vendor]
    if resource not in RESOURCES or not resource.startswith(DEFAULT_RESOURCES[target.vendor].split("/")[0]):
        fitting = ", ".join(r for r in RESOURCES if r.split("/")[0] == DEFAULT_RESOURCES[target.vendor].split("/")[0])
        raise UserError(f"--gpu-resource {resource}: not a resource of vendor {target.vendor}; use {fitting}")
    return resource


def k8s_quantity(size: str) -> str:
    """A docker size (``8g``, ``512m``) as a Kubernetes quantity (``8Gi``, ``512Mi``).

    Example:
        >>> k8s_quantity("8g")
        '8Gi'
    """
    return size[:-1] + {"k": "Ki", "m": "Mi", "g": "Gi"}[size[-1]]


def _arg(word: Word) -> str:
    return f"$({word.name})" if isinstance(word, Var) else word.replace("$(", "$$(")  # $$ keeps a literal $(


def manifests(
    project: Project,
    target: str,
    command: Sequence[str] = DEFAULT_COMMAND,
    *,
    nodes: int = 1,
    gpus: int | None = None,
    gpu_resource_name: str | None = None,
    name: str | None = None,
    namespace: str | None = None,
    launcher: str = "accelerate",
    grace: int = GRACE_S,
    env: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The manifests as data: ``[Job]`` for one node, ``[Service, Job]`` (indexed) for several.

    *gpus*: GPUs per pod (default 1 for a GPU target; one process each).

    Example:
        >>> manifests(project, "cpu")[0]["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
        1001
    """
    chosen = project.target(target)
    resource, count = _gpu_request(chosen, target, gpus, gpu_resource_name)
    job, launch = _checked(chosen, nodes=nodes, grace=grace, launcher=launcher, name=name,
                           namespace=namespace)
    image, _ = image_reference(project, chosen)
    procs = max(count, 1)
    multi = nodes > 1
    argv = launcher_argv(launch, command, nodes=nodes, procs_per_node=procs,
                         node_rank=Var("NODE_RANK") if multi else "0")
    labels = {"app.kubernetes.io/name": job, "app.kubernetes.io/managed-by": "ml-image-builder",
              f"{LABEL_PREFIX}/target": chosen.name}
    meta: dict[str, Any] = {"name": job, "labels": labels, **({"namespace": namespace} if namespace else {})}
    container: dict[str, Any] = {
        "name": "train",
        "image": image,
        "args": [_arg(w) for w in argv],
        "env": _env(chosen, job, nodes=nodes, procs=procs, env=env),
        "ports": [{"name": "rendezvous", "containerPort": DEFAULT_PORT}],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if resource is not None:
        container["resources"] = {"limits": {resource: count}}
    spec: dict[str, Any] = {
        "backoffLimit": 0,
        **({"completionMode": "Indexed", "completions": nodes, "parallelism": nodes} if multi else {}),
        "template": {"metadata": {"labels": labels},
                     "spec": _pod(chosen, job, container, grace=grace, multi=multi)},
    }
    job_doc = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}
    if not multi:
        return [job_doc]
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": meta,
        "spec": {"clusterIP": "None", "selector": labels, "publishNotReadyAddresses": True,
                 "ports": [{"name": "rendezvous", "port": DEFAULT_PORT, "targetPort": DEFAULT_PORT}]},
    }
    return [service, job_doc]


def _gpu_request(chosen: Target, target: str, gpus: int | None,
                 gpu_resource_name: str | None) -> tuple[str | None, int]:
    """The GPU resource and how many of it a pod asks for (None, 0 for a cpu target)."""
    resource = gpu_resource(chosen, gpu_resource_name)
    if resource is None and gpus:
        raise UserError(f"--gpus {gpus}: target {target} is a cpu image; leave it out or pick a GPU target")
    count = 0 if resource is None else (1 if gpus is None else gpus)
    if resource is not None and not 1 <= count <= 64:
        raise UserError(f"--gpus {count}: a {chosen.vendor} target needs 1 to 64 per pod")
    return resource, count


def _checked(chosen: Target, *, nodes: int, grace: int, launcher: str, name: str | None,
             namespace: str | None) -> tuple[str, Launcher]:
    """The Job's name and the launcher, once the options are checked."""
    if not 1 <= nodes <= 1000:
        raise UserError(f"--nodes {nodes}: give 1 to 1000")
    if not 0 <= grace <= 86400:
        raise UserError(f"--grace-period {grace}: give 0 to 86400 seconds")
    if launcher not in LAUNCHERS:
        raise UserError(f"--launcher {launcher!r}: use one of {', '.join(LAUNCHERS)}")
    job = name or re.sub(r"[^a-z0-9-]", "-", f"{chosen.name}-train")[:50].strip("-")
    if not NAME.fullmatch(job):
        raise UserError(f"--name {job!r}: use lowercase letters, digits and '-' (at most 50, starting and ending "
                        "with a letter or digit), e.g. cpu-train")
    if namespace is not None and not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", namespace):
        raise UserError(f"--namespace {namespace!r}: not a namespace name (lowercase letters, digits, '-')")
    return job, launcher


def _env(chosen: Target, job: str, *, nodes: int, procs: int,
         env: Sequence[str]) -> list[dict[str, Any]]:
    """The rendezvous (pod 0 of the Job; each pod's rank, its completion index), then the target's and
    --env's variables."""
    multi = nodes > 1
    rank_env: dict[str, Any] = (
        {"name": "NODE_RANK", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}
        if multi else {"name": "NODE_RANK", "value": "0"}
    )
    return [
        {"name": "MASTER_ADDR", "value": f"{job}-0.{job}" if multi else "127.0.0.1"},
        {"name": "MASTER_PORT", "value": str(DEFAULT_PORT)},
        {"name": "WORLD_SIZE", "value": str(nodes * procs)},
        rank_env,
        {"name": "RANK", "value": "$(NODE_RANK)"},
        *({"name": k, "value": v} for k, v in target_env(chosen, check_env(env)).items()),
    ]


def _pod(chosen: Target, job: str, container: dict[str, Any], *, grace: int,
         multi: bool) -> dict[str, Any]:
    """The pod spec: the image's user, the grace period, a memory-backed /dev/shm of the target's size."""
    shm = chosen.run_flags.shm_size
    return {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": grace,
        "securityContext": {"runAsUser": IMAGE_UID, "runAsGroup": IMAGE_UID, "runAsNonRoot": True,
                            "fsGroup": IMAGE_UID},
        **({"subdomain": job} if multi else {}),
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory",
                                                  **({"sizeLimit": k8s_quantity(shm)} if shm else {})}}],
    }


class _Dumper(yaml.SafeDumper):
    """Writes a repeated mapping (the labels) out in full: no ``&id001`` anchors for a reader to follow."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(docs: list[dict[str, Any]]) -> str:
    """The manifests as one YAML stream (``kubectl apply -f -``)."""
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
