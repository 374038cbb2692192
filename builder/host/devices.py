"""A vendor's device flags for a container on this host: used by ``builder run`` and the smoke test.

The flags come from wheel-mapping.json (``run``): NVIDIA all GPUs (a ``DeviceRequest``,
``--gpus all``); AMD ``/dev/kfd`` and ``/dev/dri``, the host GIDs of ``video``/``render`` and
of the nodes' owning groups, ``--ipc host``; Intel ``/dev/dri`` and groups. Also ``--shm-size``.
A new backend's flags go into wheel-mapping.json; how they map to this host goes here.

**CDI.** Where the host has a CDI spec for the vendor's kind (``/etc/cdi``, ``/var/run/cdi``, e.g.
from ``nvidia-ctk cdi generate``, AMD's or Intel's container toolkit; read by :mod:`.cdi`) and the
engine reads CDI specs (Docker 25+ with CDI on lists ``CDISpecDirs`` in ``docker info``; podman
always), the container gets ``--device <kind>=all`` (or each device the spec declares, where it
declares no ``all``) instead of ``--gpus all`` / the ``/dev`` nodes: :func:`choose_cdi` decides
and says why (``builder doctor`` prints it).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.config.project import Target
from builder.host import cdi, hardware
from builder.oci.docker import DeviceRequest
from builder.oci.engine import EngineFacts

#: The CDI device kind of each vendor's GPUs, as its container toolkit writes the spec.
CDI_KINDS = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu", "intel": "intel.com/gpu"}
#: The first Docker release that can hand out CDI devices (``--device vendor.com/class=name``).
CDI_DOCKER = "25.0"
#: How a vendor's container toolkit writes its CDI spec, for the vendors whose GPUs podman gives by CDI name only
#: (NVIDIA's classic flag is Docker's --gpus, through the NVIDIA runtime).
CDI_GENERATE = {"nvidia": "nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml"}
#: podman labels a container where SELinux enforces; the label may not open the GPU's device nodes (NVIDIA's
#: podman recipe turns labelling off for the container).
SELINUX_OPT = "label=disable"


@dataclass(frozen=True)
class CdiChoice:
    """Whether a vendor's GPUs go to containers by CDI name, and why (a line for ``builder doctor``)."""

    use: bool
    why: str
    devices: tuple[str, ...] = ()  # e.g. ('nvidia.com/gpu=all',)


def engine_cdi(info: EngineFacts | None) -> tuple[bool, str]:
    """Whether the engine of the facts *info* hands out CDI devices, and why.

    Docker lists ``CDISpecDirs`` once CDI is enabled (``"features": {"cdi": true}`` in
    daemon.json before Docker 28.2, on by default since); older engines lack the key. Podman
    always reads ``/etc/cdi`` and ``/var/run/cdi`` (its facts say so).

    Example:
        >>> engine_cdi(EngineFacts("Docker", "20.10.24"))
        (False, 'Docker 20.10.24 predates CDI (25.0)')
        >>> engine_cdi(EngineFacts("podman", "4.3.1", cdi_spec_dirs=("/etc/cdi", "/var/run/cdi")))
        (True, 'podman 4.3.1 reads CDI specs from /etc/cdi, /var/run/cdi')
    """
    if info is None:
        return False, "no engine answered"
    version = info.version
    if info.cdi_spec_dirs:
        return True, f"{info.product} {version} reads CDI specs from {', '.join(info.cdi_spec_dirs)}"
    try:
        old = tuple(int(x) for x in version.split(".")[:2]) < tuple(int(x) for x in CDI_DOCKER.split("."))
    except ValueError:
        old = False
    if old:
        return False, f"Docker {version} predates CDI ({CDI_DOCKER})"
    return False, f'Docker {version} has CDI off (set "features": {{"cdi": true}} in daemon.json)'


def choose_cdi(vendor: str, specs: Sequence[cdi.Spec], engine: tuple[bool, str]) -> CdiChoice:
    """CDI names when the host has a spec for *vendor* and the engine supports CDI; else the classic flags.

    *specs*: the specs declaring the vendor's kind (:func:`builder.host.cdi.specs`);
    *engine*: :func:`engine_cdi`'s answer. The names: :func:`builder.host.cdi.qualified`.

    Example:
        >>> spec = cdi.Spec("/etc/cdi/nvidia.yaml", "nvidia.com/gpu", ("0", "all"))
        >>> choose_cdi("nvidia", [spec], (True, "Docker 28.0.1 reads ...")).devices
        ('nvidia.com/gpu=all',)
    """
    kind = CDI_KINDS.get(vendor)
    if kind is None:
        return CdiChoice(False, f"{vendor}: no CDI kind; the classic flags")
    specs = [s for s in specs if s.kind == kind]
    if not specs:
        return CdiChoice(False, f"no CDI spec for {kind} in {' or '.join(hardware.CDI_DIRS)}; the classic flags")
    paths = ", ".join(s.path for s in specs)
    ok, why = engine
    if not ok:
        return CdiChoice(False, f"CDI spec {paths} for {kind}, but {why}; the classic flags")
    names = cdi.qualified(kind, specs)
    if not names:
        return CdiChoice(False, f"CDI spec {paths} for {kind} declares no device; the classic flags")
    return CdiChoice(True, f"CDI spec {paths} for {kind} and {why}", names)


def host_cdi(
    vendor: str,
    engine_info: Callable[[], EngineFacts | None] | None,
    cdi_dirs: Iterable[Path | str] = hardware.CDI_DIRS,
    engine: str = "docker",
) -> CdiChoice:
    """:func:`choose_cdi` for this host and *engine* (``docker`` or ``podman``); Docker is asked (*engine_info*)
    only when a spec exists, podman never (it always reads CDI specs).

    Example:
        >>> host_cdi("nvidia", lambda: connect().info()).use
        False
    """
    kind = CDI_KINDS.get(vendor)
    specs = cdi.specs(cdi_dirs, kind) if kind else []
    if engine == "podman":
        return choose_cdi(vendor, specs, (True, f"podman reads CDI specs from {', '.join(cdi.CDI_DIRS)}"))
    if kind and specs and engine_info is None:
        return CdiChoice(False, f"CDI spec {', '.join(s.path for s in specs)} for {kind}, but the engine was "
                                "not asked; the classic flags")
    return choose_cdi(vendor, specs, engine_cdi(engine_info() if specs and engine_info else None))


def cdi_only(vendor: str, choice: CdiChoice) -> tuple[str, str]:
    """Why an engine that gives *vendor*'s GPUs by CDI name only (podman, NVIDIA: its ``--gpus`` is a no-op before
    podman 5 and a CDI name from 5.0) gives none when *choice* found no name to use, and the command that makes the
    spec.

    Example:
        >>> cdi_only("nvidia", CdiChoice(False, "no CDI spec for nvidia.com/gpu in /etc/cdi; the classic flags"))
        ('podman gives nvidia GPUs by CDI name only, and no CDI spec for nvidia.com/gpu in /etc/cdi', 'nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml')
    """
    why = choice.why.removesuffix("; the classic flags")
    make = CDI_GENERATE.get(vendor, f"the {vendor} container toolkit's CDI generator")
    return f"podman gives {vendor} GPUs by CDI name only, and {why}", make


def device_kwargs(
    gpus: bool, devices: Sequence[str], group_add: Sequence[int | str], ipc_mode: str | None, shm_size: str | None,
    cdi_devices: Sequence[str] = (), security_opt: Sequence[str] = (),
) -> dict[str, Any]:
    """docker-py ``containers.create`` options that hand a container its GPUs.

    CDI names become a device request of the ``cdi`` driver, as ``docker run --device
    nvidia.com/gpu=all`` sends them.

    Example:
        >>> device_kwargs(True, (), (), None, "8g")["device_requests"][0]["Capabilities"]
        [['gpu']]
        >>> device_kwargs(False, (), (), None, None, ["nvidia.com/gpu=all"])["device_requests"][0]["Driver"]
        'cdi'
    """
    requests = [DeviceRequest(count=-1, capabilities=[["gpu"]])] if gpus else []
    if cdi_devices:
        requests.append(DeviceRequest(driver="cdi", device_ids=list(cdi_devices)))
    return {
        "device_requests": requests or None,
        "devices": [f"{d}:{d}:rwm" for d in devices] or None,
        "group_add": [str(g) for g in group_add] or None,
        "security_opt": list(security_opt) or None,
        "ipc_mode": ipc_mode,
        "shm_size": shm_size,
    }

@dataclass(frozen=True)
class DeviceFlags:
    """A vendor's device flags worked out for this host."""

    gpus: bool = False
    devices: tuple[str, ...] = ()
    group_add: tuple[int | str, ...] = ()  # GIDs, or podman's keep-groups
    ipc_mode: str | None = None
    shm_size: str | None = None
    notes: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    cdi_devices: tuple[str, ...] = ()
    security_opt: tuple[str, ...] = ()

    def docker_kwargs(self) -> dict[str, Any]:
        return device_kwargs(self.gpus, self.devices, self.group_add, self.ipc_mode, self.shm_size, self.cdi_devices,
                             self.security_opt)

def device_flags(
    target: Target,
    host: hardware.HostGpus,
    *,
    gpus: bool = True,
    environ: Mapping[str, str] | None = None,
    cdi: CdiChoice | None = None,
    engine: str = "docker",
    rootless: bool = False,
) -> DeviceFlags:
    """The target vendor's ``run`` flags for *engine* (``docker`` or ``podman``), with group names turned into
    this host's GIDs.

    *problems* are reasons the engine would refuse (a missing node, no GPU of the vendor) or run without the GPUs
    (podman with no CDI name for NVIDIA's); ``builder run`` stops on them, ``--dry-run`` shows them. With a *cdi*
    choice that uses CDI, the CDI name replaces ``--gpus all`` and the ``/dev`` nodes (the groups and IPC stay).
    podman on a host where SELinux enforces gets ``--security-opt label=disable`` with the devices; a *rootless*
    podman keeps the user's own groups (``--group-add keep-groups``, crun) where the vendor's nodes need a group:
    a host GID would name a subordinate one inside its user namespace.

    Example:
        >>> device_flags(amd_target, hardware.detect()).devices  # doctest: +SKIP
        ('/dev/kfd', '/dev/dri')
    """
    environ = os.environ if environ is None else environ
    flags = target.run_flags
    if not gpus or target.vendor == "cpu":
        without = (
            (f"--no-gpus: running the {target.vendor} image without its devices",)
            if target.vendor != "cpu"
            else ()
        )
        return DeviceFlags(shm_size=flags.shm_size, notes=without)
    notes: list[str] = [f"devices by CDI name: {cdi.why}"] if cdi is not None and cdi.use else []
    use_cdi = cdi is not None and cdi.use and bool(cdi.devices)
    problems = _host_problems(target, host, environ, () if use_cdi else flags.devices)
    gids, missing_groups = _group_ids(flags.group_add, host)
    found = DeviceFlags(
        gpus=flags.gpus and not use_cdi,
        devices=() if use_cdi else tuple(flags.devices),
        cdi_devices=cdi.devices if use_cdi and cdi is not None else (),
        group_add=gids,
        # With host IPC the host's /dev/shm is used and --shm-size has no effect; kept as the guides give it.
        ipc_mode="host" if flags.ipc_host else None,
        shm_size=flags.shm_size,
        notes=tuple(notes + missing_groups),
        problems=tuple(problems),
    )
    return _on_podman(found, target.vendor, cdi, host.selinux, rootless) if engine == "podman" else found


def _on_podman(flags: DeviceFlags, vendor: str, cdi: CdiChoice | None, selinux: bool, rootless: bool) -> DeviceFlags:
    """*flags* as podman takes them: no ``--gpus`` (NVIDIA's GPUs go by CDI name or not at all: a problem that
    says how to make the spec), labelling off where SELinux enforces, the user's own groups when rootless."""
    problems, notes = list(flags.problems), list(flags.notes)
    if flags.gpus:
        why, make = cdi_only(vendor, cdi or CdiChoice(False, "no CDI name was chosen"))
        problems.append(f"{why}: make the spec with '{make}' (as root), or pass --no-gpus")
    if selinux:
        notes.append(f"SELinux enforces here: --security-opt {SELINUX_OPT}, as NVIDIA's podman recipe has it (the "
                     "container's label may not open the GPU's device nodes)")
    return dataclasses.replace(
        flags, gpus=False, problems=tuple(problems), notes=tuple(notes),
        security_opt=(SELINUX_OPT,) if selinux else (),
        group_add=("keep-groups",) if rootless and flags.group_add else flags.group_add,
    )


def _host_problems(target: Target, host: hardware.HostGpus, environ: Mapping[str, str],
                   devices: Sequence[str]) -> list[str]:
    """Why the engine would refuse the container: no usable GPU of the vendor (unless the vendor is
    forced), a device node missing."""
    problems = []
    forced = environ.get(hardware.VENDOR_ENV, "").strip().lower() == target.vendor
    if target.vendor not in host.usable() and not forced:
        found = host.describe(target.vendor)
        lack = "; ".join(host.missing(target.vendor)) if found else "no such GPU on the PCI bus"
        problems.append(
            f"target {target.name} needs a usable {target.vendor} GPU and this host has none ({lack}); "
            f"pass --no-gpus to run it without GPUs, or --target auto"
        )
    for device in devices:
        if not host.nodes.host_path(device).exists():
            problems.append(
                f"{device}: missing on this host; load the {target.vendor} driver, or pass --no-gpus"
            )
    return problems


def _group_ids(names: Sequence[str], host: hardware.HostGpus) -> tuple[tuple[int, ...], list[str]]:
    """The GIDs to add for the named groups and the device nodes' owners, and a note per group the host
    lacks."""
    if not names:
        return (), []
    known = hardware.group_gids(names)
    notes = [f"host has no {name!r} group; relying on the device nodes' groups"
             for name in names if name not in known]
    return tuple(hardware.container_gids(names, host.nodes)), notes


def device_options(
    target: Target, engine: str = "docker", engine_info: Callable[[], EngineFacts | None] | None = None,
) -> tuple[dict[str, Any], str | None]:
    """docker-py options giving a test container this target's GPUs on *engine* (asked *engine_info* about CDI, as
    ``builder run`` asks it), or ({}, why not) (the smoke test).

    Example:
        >>> device_options(project.target("cpu"))
        ({}, 'cpu target: no device to test')
    """
    if target.vendor == "cpu":
        return {}, "cpu target: no device to test"
    host = hardware.detect()
    if target.vendor not in host.usable():
        found = host.describe(target.vendor) or "none on the PCI bus"
        lack = "; ".join(host.missing(target.vendor)) if host.describe(target.vendor) else ""
        return {}, f"this host has no usable {target.vendor} GPU ({found}{'; ' + lack if lack else ''})"
    flags = device_flags(target, host, cdi=host_cdi(target.vendor, engine_info, engine=engine), engine=engine)
    if flags.problems:
        return {}, "; ".join(flags.problems)
    return {k: v for k, v in flags.docker_kwargs().items() if v is not None}, None


@dataclass(frozen=True)
class NodeDevices:
    """A vendor's device flags for another machine (a Slurm node), to be finished there.

    The generating host cannot see the node, so the node works out the rest when the job
    runs: whether to use the CDI name (*cdi_kind* spec present and the engine reads CDI specs,
    as :func:`choose_cdi` decides here), and the GIDs of *groups* and of *gid_nodes*' owners
    (as :func:`builder.host.hardware.container_gids` does here). Where the engine has no
    *classic* form (podman, NVIDIA), *no_cdi* is the line the node says without a spec.

    Example:
        >>> node_devices(project.target("nvidia-cu130")).classic
        ('--gpus', 'all')
    """

    classic: tuple[str, ...] = ()
    other: tuple[str, ...] = ()
    cdi_kind: str | None = None
    groups: tuple[str, ...] = ()
    gid_nodes: tuple[str, ...] = ()
    no_cdi: str | None = None


def node_devices(target: Target, *, gpus: bool = True, engine: str = "docker") -> NodeDevices:
    """The target vendor's ``docker run`` or ``podman run`` (*engine*) flags for a node (see :class:`NodeDevices`).

    Example:
        >>> node_devices(project.target("amd-rocm5.7")).gid_nodes
        ('/dev/kfd', '/dev/dri/renderD*')
        >>> node_devices(project.target("nvidia-cu130"), engine="podman").classic
        ()
    """
    flags = target.run_flags
    shm = ("--shm-size", flags.shm_size) if flags.shm_size else ()
    if not gpus or target.vendor == "cpu":
        return NodeDevices(other=shm)
    kind = CDI_KINDS.get(target.vendor)
    no_cdi = None
    classic: tuple[str, ...] = ()
    if flags.gpus and engine == "podman":  # podman has no --gpus of its own: NVIDIA's GPUs go by CDI name only
        why, make = cdi_only(target.vendor, CdiChoice(False, f"no CDI spec for {kind} in {' or '.join(cdi.CDI_DIRS)} "
                                                             "declares the device all"))
        no_cdi = f"{why}; make it (as root): {make}"
    elif flags.gpus:
        classic = ("--gpus", "all")
    for device in flags.devices:
        classic += ("--device", device)
    gid_nodes = tuple(
        n for d in flags.devices for n in ((d,) if d != "/dev/dri" else ("/dev/dri/renderD*",))
    ) if flags.group_add else ()
    return NodeDevices(
        classic=classic,
        other=(("--ipc", "host") if flags.ipc_host else ()) + shm,
        cdi_kind=kind,
        groups=tuple(flags.group_add),
        gid_nodes=gid_nodes,
        no_cdi=no_cdi,
    )
