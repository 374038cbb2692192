"""What ``builder print`` shows: the resolved project with each platform's content tag, layer plan
and build plan, as a pydantic model. It is a pure value (as ``docker buildx bake --print`` is): made
without the engine or a registry.

Its JSON Schema is committed as ``docs/print.schema.json`` (``make schema`` writes it:
``builder print --schema``); tests/test_print_schema.py fails when the model and the file differ, and
``bench`` reads ``builder print`` through that file, not through this module.

Example:
    >>> shown = show(project, [project.target("cpu")])
    >>> shown.targets[0].plan["linux/amd64"].stages
    ['build', 'smoke', 'tag']
    >>> schema()["title"]
    'builder print'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from builder.config.matrix import Compression
from builder.config.project import Project, Target
from builder.config.urls import public
from builder.config.wheelmap import RunFlags
from builder.images.plan import ViewPlan, make_plan
from builder.wheels import layers


class _Value(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Layer(_Value):
    """One layer of a platform's layer plan (builder/wheels/layers.py)."""

    name: str = Field(description="The layer (matrix.yaml layers; `packages` last).")
    wheels: list[str] = Field(description="Its locked wheels, `name==version`, in install order (empty until "
                                          "the platform is locked).")


class BuildPlan(_Value):
    """The build of one platform (builder/images/plan.py's ViewPlan), as a plain build runs it."""

    content_tag: str = Field(description="`<registry>:<target>-<12 hex>`: a digest of everything that goes "
                                         "into the image (builder/images/content.py).")
    local_refs: list[str] = Field(description="The tags the image gets in the local engine.")
    push_refs: list[str] = Field(description="The tags it is pushed under, in order (aliases last; platform "
                                             "tags for a multi-platform target).")
    cache_sources: list[str] = Field(description="Where a build without the image reads cache from, the first "
                                                 "the registry has.")
    build_args: dict[str, str] = Field(description="The Dockerfile's build arguments.")
    contexts: dict[str, str] = Field(description="The named build contexts (`wheels-<layer>`: that layer's "
                                                 "staged wheels; where the engine's builds read images in place, "
                                                 "the build reads the image loaded from that folder instead, "
                                                 "`docker-image://ml-image-builder.invalid/contexts/...`).")
    labels: dict[str, str] = Field(description="The labels set at build time (the commit's revision and time).")
    cache_to: list[str] = Field(description="The cache exports (`--cache-to`).")
    early_stages: list[str] = Field(description="The stages exported beside the build, each once its first step "
                                                "runs, their layers compressed and nothing stored (BuildKit, where "
                                                "the image store keeps layers compressed and the wheels' contexts "
                                                "are images): each wheel layer's below the plan's last.")
    stages: list[str] = Field(description="What a plain `builder build` does, in order: build, smoke, tag "
                                          "(push, attest, record with --push).")

    @classmethod
    def of(cls, plan: ViewPlan) -> BuildPlan:
        request = plan.request
        return cls(content_tag=plan.content_tag, local_refs=list(plan.local_refs), push_refs=list(plan.push_refs),
                   cache_sources=list(plan.cache_sources), build_args=dict(request.build_args),
                   contexts=dict(request.contexts), labels=dict(request.labels), cache_to=list(request.cache_to),
                   early_stages=list(request.early_stages), stages=list(plan.stages))


class PrintedTarget(_Value):
    """A target with every value worked out (builder/config/project.py's Target), and per platform its
    lock, content tag, layer plan and build plan."""

    name: str
    backend: str = Field(description="cuda, rocm, xpu or cpu.")
    vendor: str = Field(description="nvidia, amd, intel or cpu.")
    accelerator_version: str | None = Field(description="The CUDA or ROCm version; null for xpu and cpu.")
    torch: str = Field(description="The torch version matrix.yaml asks for.")
    torch_pin: str = Field(description="torch's version with its local suffix (`2.13.0+cpu`).")
    entry: str = Field(description="The wheel-mapping.json entry it installs from.")
    index_url: str = Field(description="The wheel index, credential-free (an index given with its login is "
                                       "used as given, never shown).")
    packages: list[str] = Field(description="The target's own requirements beyond torch.")
    distributed: str = Field(description="The torch.distributed backend (nccl, gloo, xccl, ...).")
    tags: list[str]
    refs: list[str] = Field(description="The registry's references, one per tag.")
    labels: dict[str, str]
    env: dict[str, str] = Field(description="ENV set in the image.")
    run: RunFlags = Field(description="How a container gets the vendor's devices.")
    visible_devices_env: str | None = Field(description="The variable that selects devices for a process.")
    dockerfile: str
    platforms: list[str]
    platform: str = Field(description="The default platform: the host's when listed, else the first.")
    layers: dict[str, list[Layer]] = Field(description="Per platform: the layer plan, in install order.")
    k8s_resource: str | None = Field(description="The Kubernetes resource `builder k8s` asks for (null: the "
                                                 "vendor's default).")
    compression: Compression = Field(description="The layer compression of its image.")
    locks: dict[str, str] = Field(description="Per platform: its hash lock, relative to the project's root.")
    content_tags: dict[str, str] = Field(description="Per platform: the tag its image gets once built and "
                                                     "smoke-tested.")
    plan: dict[str, BuildPlan] = Field(description="Per platform: the build's plan.")


class Printed(_Value):
    """``builder print``: the resolved project (matrix.yaml, wheel-mapping.json, base.lock.json)."""

    model_config = ConfigDict(title="builder print",
                              json_schema_extra={"$schema": "https://json-schema.org/draft/2020-12/schema"})

    root: str = Field(description="The project's folder.")
    registry: str = Field(description="Where the images go (`host/repository`).")
    base: dict[str, str] = Field(description="Per platform: the base the builds start FROM.")
    python: str
    installer: str
    common_packages: list[str]
    groups: dict[str, list[str]] = Field(description="Each group's targets (`default`, `all`, then matrix.yaml's).")
    targets: list[PrintedTarget] = Field(description="The selected targets, in matrix.yaml's order.")


def _target(project: Project, target: Target, planned: dict[str, ViewPlan]) -> PrintedTarget:
    views = target.views()
    fields = asdict(target) | {
        "index_url": public(target.index_url) if target.index_url else target.index_url,
        "run": target.run_flags,
        "platform": target.default_view.platform,
        "layers": {v.platform: [Layer(name=layer.name, wheels=[f"{p.name}=={p.version}" for p in layer.pins])
                                for layer in layers.layer_plan(project, v)] for v in views},
        "locks": {v.platform: v.lock for v in views},
        "content_tags": {v.platform: planned[v.unit].content_tag for v in views},
        "plan": {v.platform: BuildPlan.of(planned[v.unit]) for v in views},
    }
    return PrintedTarget(**fields)  # a field Target gains and this model lacks fails here (extra="forbid")


def show(project: Project, targets: Sequence[Target]) -> Printed:
    """What ``builder print`` shows of *targets* (listed in the project's order): one plan for all of
    them (one git call for the commit's labels)."""
    names = {t.name for t in targets}
    selected = [t for t in project.targets if t.name in names]
    planned = {p.unit: p for p in make_plan(project, [v for t in selected for v in t.views()]).views}
    matrix = project.matrix
    return Printed(
        root=str(project.root),
        registry=matrix.registry,
        base=dict(project.base_refs),
        python=matrix.python,
        installer=matrix.installer,
        common_packages=list(matrix.common_packages),
        groups={name: matrix.group(name) for name in dict.fromkeys(["default", "all", *matrix.groups])},
        targets=[_target(project, t, planned) for t in selected],
    )


def schema() -> dict[str, Any]:
    """The JSON Schema of :class:`Printed` (what docs/print.schema.json holds)."""
    return Printed.model_json_schema(mode="serialization")
