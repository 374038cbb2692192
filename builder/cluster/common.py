"""What the Slurm script and the Kubernetes manifests share: image, launcher line, checked names.

The training command runs through a launcher that starts the processes of one node and joins
the others at the rendezvous: ``accelerate launch`` (default) or ``torchrun``. The per-node
values (node rank, rendezvous address and port) are :class:`Var` placeholders that each
scheduler writes its own way: ``"$NODE_RANK"`` in a shell, ``$(NODE_RANK)`` in a manifest.

Example:
    >>> launcher_argv("torchrun", ["/opt/examples/train.py"], nodes=2, procs_per_node=1)[:3]
    ['torchrun', '--nnodes', '2']
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from builder.config.errors import UserError
from builder.config.files import published_path
from builder.config.project import Project, Target

Launcher = Literal["accelerate", "torchrun"]
LAUNCHERS: tuple[Launcher, ...] = ("accelerate", "torchrun")
#: The rendezvous port where the scheduler does not pick a free one (Kubernetes: the pod's own).
DEFAULT_PORT = 29500
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Var:
    """A per-node value the scheduler fills in (an environment variable's name)."""

    name: str


Word = str | Var


def script_words(command: Sequence[str]) -> list[str]:
    """The training script and its arguments as the launcher takes them: without a leading ``python``.

    Example:
        >>> script_words(["python3", "train.py", "--epochs", "5"])
        ['train.py', '--epochs', '5']
    """
    script = list(command)
    if script and script[0] in ("python", "python3"):
        script = script[1:]
    if not script:
        raise UserError("no training script given; write it after '--', e.g. -- /opt/examples/train.py --epochs 5")
    return script


def launcher_argv(
    launcher: Launcher,
    command: Sequence[str],
    *,
    nodes: int,
    procs_per_node: int,
    node_rank: Word = Var("NODE_RANK"),
    addr: Word = Var("MASTER_ADDR"),
    port: Word = Var("MASTER_PORT"),
) -> list[Word]:
    """The launcher line that starts this node's *procs_per_node* processes of *command*.

    *command* is the training script and its arguments (a leading ``python``/``python3`` is
    dropped: the launcher starts Python itself; ``-m module`` works with both launchers).

    Example:
        >>> launcher_argv("accelerate", ["python", "train.py"], nodes=2, procs_per_node=1)[-1]
        'train.py'
    """
    script = script_words(command)
    world = str(nodes * procs_per_node)
    if launcher == "torchrun":
        return ["torchrun", "--nnodes", str(nodes), "--nproc_per_node", str(procs_per_node),
                "--node_rank", node_rank, "--master_addr", addr, "--master_port", port, *script]
    if launcher == "accelerate":
        # --multi_gpu is accelerate's multi-process launcher (with ACCELERATE_USE_CPU=true on CPUs: gloo).
        return ["accelerate", "launch", "--multi_gpu", "--num_machines", str(nodes), "--num_processes", world,
                "--machine_rank", node_rank, "--main_process_ip", addr, "--main_process_port", port,
                "--mixed_precision", "no", "--dynamo_backend", "no", *script]
    raise UserError(f"--launcher {launcher!r}: use one of {', '.join(LAUNCHERS)}")


def shell_words(words: Sequence[Word]) -> str:
    """A shell line: every literal word quoted (``shlex.quote``), every :class:`Var` as ``"$NAME"``.

    Example:
        >>> shell_words(["echo", "it's", Var("NODE_RANK")])
        'echo \\'it\\'"\\'"\\'s\\' "$NODE_RANK"'
    """
    return " ".join(f'"${w.name}"' if isinstance(w, Var) else shlex.quote(w) for w in words)


def check_env(pairs: Sequence[str]) -> dict[str, str]:
    """``--env K=V`` values for the containers (a value is required: the host's is not the nodes').

    Example:
        >>> check_env(["SEED=1", "OMP_NUM_THREADS=4"])
        {'SEED': '1', 'OMP_NUM_THREADS': '4'}
    """
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not ENV_NAME.fullmatch(key):
            raise UserError(f"--env {pair!r}: expected KEY=VALUE with KEY like SEED or OMP_NUM_THREADS")
        if "\0" in value:
            raise UserError(f"--env {key}: the value holds a NUL byte; remove it")
        out[key] = value
    return out


def target_env(target: Target, extra: Mapping[str, str]) -> dict[str, str]:
    """The containers' variables: CPU targets run the multi-process launcher on gloo, then ``--env``.

    Example:
        >>> target_env(project.target("cpu"), {})
        {'ACCELERATE_USE_CPU': 'true'}
    """
    env = {"ACCELERATE_USE_CPU": "true"} if target.vendor == "cpu" else {}
    return {**env, **extra}


def image_reference(project: Project, target: Target) -> tuple[str, str]:
    """The target's image, by digest when ``dist/published.json`` records it, and where it came from.

    A multi-platform target's record is its index: each node pulls its own platform.

    Example:
        >>> image_reference(project, project.target("cpu"))  # doctest: +SKIP
        ('localhost:5000/ml-runtime@sha256:...', 'digest from dist/published.json')
    """
    path = published_path(project.root)
    try:
        records = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: unreadable ({exc}); delete it or publish again with builder build --push") from None
    record = records.get(target.name) if isinstance(records, dict) else None
    reference = record.get("reference") if isinstance(record, dict) else None
    repository = target.primary_ref.rsplit(":", 1)[0]
    if isinstance(reference, str) and reference.startswith(repository + "@sha256:"):
        return reference, f"digest from {path.relative_to(project.root)}"
    return target.primary_ref, f"tag (not in {path.relative_to(project.root)}: publish with builder build --push)"
