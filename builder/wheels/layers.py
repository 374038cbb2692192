"""The layer plan: a target's locked wheels installed in a few layers, by what changes together.

``matrix.yaml``'s ``layers`` (documented in :class:`builder.config.matrix.Layer`) lists the
layers in install order, each with fnmatch patterns over canonical wheel names; a wheel goes into
the first layer of the target's backend that matches it, and every wheel no layer matches (the
target's own ``packages``) into the last one, ``packages``, which the template puts above the
in-image runtime. The plan is derived from the lock alone, so it is the same on every machine.

Each layer's ``RUN`` gets its wheels (``name==version --hash=sha256:<hex>``) as the build
argument ``WHEELS_<NAME>``: the build cache, and so the layer, depends on that layer's wheels and
on the layers below, never on the rest of the lock. With fixed file times (the template's
``fixed_times`` macro), two targets that lock the same ``nvidia-*`` wheels get byte-identical
library layers, which a registry and a node store once.

Example:
    >>> [(layer.name, len(layer.pins)) for layer in layer_plan(project, project.target("nvidia-cu130").default_view)]
    [('cuda-dnn', 1), ('cuda-blas', 3), ('cuda-solvers', 3), ('cuda-runtime', 12), ('triton', 1), ('torch', 1),
     ('accelerate', 1), ('packages', 0)]
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

from packaging.utils import canonicalize_name

from builder.config.errors import UserError
from builder.config.matrix import PACKAGES_LAYER, Matrix
from builder.config.project import Project, TargetView
from builder.wheels.lockfile import Pin, ordered, read_lock
from builder.wheels.locks import shared_lock_path


@dataclass(frozen=True)
class PlannedLayer:
    """One layer of a target view's plan and the locked wheels it installs."""

    name: str
    pins: tuple[Pin, ...]

    @property
    def arg(self) -> str:
        """The build argument that carries this layer's wheels.

        Example:
            >>> PlannedLayer("cuda-dnn", ()).arg
            'WHEELS_CUDA_DNN'
        """
        return arg_name(self.name)

    @property
    def requirements(self) -> str:
        """The argument's value: one ``name==version --hash=sha256:<hex>`` per wheel, space-separated
        (the ``RUN`` writes them back one per line with ``printf '%s %s\\n'``)."""
        return " ".join(f"{p.name}=={p.version} --hash=sha256:{p.sha256}" for p in self.pins)


def arg_name(layer: str) -> str:
    """``cuda-dnn`` -> ``WHEELS_CUDA_DNN``."""
    return "WHEELS_" + layer.upper().replace("-", "_")


def context_name(layer: str) -> str:
    """The named build context a layer's wheels reach its ``RUN`` as: ``cuda-dnn`` -> ``wheels-cuda-dnn``.

    One context per layer, not one context with a folder per layer: BuildKit keeps a context's
    last transfer to send only what changed, per context; several ``RUN``s mounting different
    folders of one context each transfer theirs into that one copy, undoing the others', so every
    build sent the wheels again (0.74 GB of nvidia-cu130's, 9 s, with every step cached).
    """
    return "wheels-" + layer


def stage_name(layer: str) -> str:
    """The rendered Dockerfile's stage that installs *layer*: ``cuda-dnn`` -> ``wheel-layer-cuda-dnn``
    (not its context's name: a stage of that name would hide the context)."""
    return "wheel-layer-" + layer


def early_stages(target_layers: Sequence[str]) -> tuple[str, ...]:
    """The stages a build exports early, one per wheel layer below the plan's last (accelerate,
    small) and the target's packages: each layer is compressed from the moment its step ends,
    while the layers above it install (:class:`builder.oci.buildkit.EarlyExports`).

    Example:
        >>> early_stages(["cuda-dnn", "torch", "accelerate", "packages"])
        ('wheel-layer-cuda-dnn', 'wheel-layer-torch')
    """
    return tuple(stage_name(layer) for layer in target_layers[:-2])


def layer_of(matrix: Matrix, backend: str, wheel: str) -> str:
    """The layer a wheel goes into on *backend*: the first whose patterns match its canonical name.

    Example:
        >>> layer_of(project.matrix, "cuda", "nvidia_cublas")
        'cuda-blas'
        >>> layer_of(project.matrix, "cpu", "accelerate")
        'accelerate'
    """
    name = canonicalize_name(wheel)
    for layer in matrix.layers:
        if layer.applies_to(backend) and any(fnmatch.fnmatchcase(name, p) for p in layer.match):
            return layer.name
    return PACKAGES_LAYER


def layer_plan(project: Project, view: TargetView, pins: list[Pin] | None = None) -> list[PlannedLayer]:
    """Every layer of the target view's plan, in install order, with its wheels (from *pins*,
    else the view's lock; a layer may be empty on one platform: its ``RUN`` then installs nothing).

    The last layer, ``packages``, is installed above the runtime, after the start-up bytecode
    step: a wheel that ``startup_imports`` names may not land there.
    """
    locked = ordered(read_lock(project.root / view.lock)[1] if pins is None else pins)
    layers = [
        PlannedLayer(name, tuple(p for p in locked if layer_of(project.matrix, view.backend, p.name) == name))
        for name in view.layers
    ]
    startup = {canonicalize_name(m.split(".")[0]) for m in project.matrix.startup_imports}
    late = sorted(canonicalize_name(p.name) for p in layers[-1].pins if canonicalize_name(p.name) in startup)
    if late:
        raise UserError(
            f"matrix.yaml layers: {', '.join(late)} ({view.unit}) matches no layer, so it would go into the last "
            f"one, {PACKAGES_LAYER!r}, above the start-up bytecode step that imports it; add a layer that matches it"
        )
    return layers


def shared_and_planned(project: Project, view: TargetView) -> list[PlannedLayer]:
    """The platform's shared locks as layers (``tools``: the installer; ``common``), then the view's plan."""

    shared = [PlannedLayer(name, tuple(read_lock(shared_lock_path(project, name, view.platform))[1]))
              for name in ("tools", "common")]
    return [*shared, *layer_plan(project, view)]


def build_args(project: Project, view: TargetView) -> dict[str, str]:
    """{``WHEELS_<NAME>``: the layer's wheels} for every layer of the view's plan, and the
    platform's shared locks: ``WHEELS_TOOLS`` (the installer) and ``WHEELS_COMMON``."""
    return {layer.arg: layer.requirements for layer in shared_and_planned(project, view)}


def context_layers(project: Project, view: TargetView) -> dict[str, list[Pin]]:
    """{layer: its wheels}: the view's wheels, one named context per layer (:func:`context_name`)."""
    return {layer.name: list(layer.pins) for layer in shared_and_planned(project, view)}
