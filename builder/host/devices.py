"""A vendor's device flags for a container on this host: used by ``builder run`` and the smoke test.

The flags come from wheel-mapping.json (``run``): NVIDIA all GPUs (a ``DeviceRequest``,
``--gpus all``); AMD ``/dev/kfd`` and ``/dev/dri``, the host GIDs of ``video``/``render`` and
of the nodes' owning groups, ``--ipc host``; Intel ``/dev/dri`` and groups. Also ``--shm-size``.
A new backend's flags go into wheel-mapping.json; how they map to this host goes here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import docker.types

from builder.config.project import ResolvedTarget
from builder.host import hardware


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
    host: hardware.HostGpus,
    *,
    gpus: bool = True,
    environ: Mapping[str, str] | None = None,
) -> DeviceFlags:
    """The target vendor's ``run`` flags, with group names turned into this host's GIDs.

    *problems* are reasons the engine would refuse (a missing node, no GPU of the vendor);
    ``builder run`` stops on them, ``--dry-run`` shows them.

    Example:
        >>> device_flags(amd_target, hardware.detect()).devices
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
    notes: list[str] = []
    problems: list[str] = []
    forced = environ.get(hardware.VENDOR_ENV, "").strip().lower() == target.vendor
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
        known = hardware.group_gids(flags.group_add)
        notes += [
            f"host has no {name!r} group; relying on the device nodes' groups"
            for name in flags.group_add
            if name not in known
        ]
        gids = tuple(hardware.container_gids(flags.group_add, host.nodes))
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


def device_options(target: ResolvedTarget) -> tuple[dict[str, Any], str | None]:
    """docker-py options giving a test container this target's GPUs, or ({}, why not) (the smoke test).

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
    flags = device_flags(target, host)
    if flags.problems:
        return {}, "; ".join(flags.problems)
    return {k: v for k, v in flags.docker_kwargs().items() if v is not None}, None
