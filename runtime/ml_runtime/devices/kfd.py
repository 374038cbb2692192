"""AMD GPUs from the kernel's KFD topology in sysfs, as ROCm's own runtime finds them, without HIP.

Each GPU is a node of ``/sys/class/kfd/kfd/topology/nodes/N`` whose ``properties`` give
``gfx_target_version`` (major * 10000 + minor * 100 + stepping, the last two in hex in the
target's name: 90010 is gfx90a, 90402 gfx942) and ``drm_render_minor``; a node whose render node
``/dev/dri/renderD<minor>`` is absent was not given to this container, and ROCm skips it too.
Memory is ``local_mem_size``, else the node's memory banks; the name is the board's
``product_name`` where the driver exposes it, else ``AMD <gfx target>``. :func:`visible_gpus`
applies ``ROCR_VISIBLE_DEVICES`` and then ``HIP_VISIBLE_DEVICES`` (or ``CUDA_VISIBLE_DEVICES``)
when they are plain indices; any other value is left to torch (the probe asks it).

Example:
    >>> gfx_name(90010), gfx_name(90402), gfx_name(110000)
    ('gfx90a', 'gfx942', 'gfx1100')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ml_runtime.devices.facts import DeviceFacts

TOPOLOGY = "sys/class/kfd/kfd/topology/nodes"


def gfx_name(version: int) -> str:
    """The gfx target of a KFD ``gfx_target_version``.

    Example:
        >>> gfx_name(90500)
        'gfx950'
    """
    return f"gfx{version // 10000}{(version // 100) % 100:x}{version % 100:x}"


def _properties(path: Path) -> dict[str, int]:
    values: dict[str, int] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        key, _, value = line.strip().partition(" ")
        if value.strip().lstrip("-").isdigit():
            values[key] = int(value.strip())
    return values


def _memory(node: Path, props: Mapping[str, int]) -> int | None:
    if props.get("local_mem_size"):
        return props["local_mem_size"]
    banks = [_properties(p).get("size_in_bytes", 0) for p in sorted(node.glob("mem_banks/*/properties"))]
    return sum(banks) or None


def _name(root: Path, minor: int, gfx: str) -> str:
    try:
        name = (root / "sys/class/drm" / f"renderD{minor}" / "device/product_name").read_text().strip()
    except OSError:
        name = ""
    return name or f"AMD {gfx}"


def read_kfd(root: Path = Path("/")) -> list[DeviceFacts]:
    """The GPUs this container may use, in KFD's order (``index`` counts them); [] without KFD.

    Example:
        >>> read_kfd(Path("/nonexistent"))
        []
    """
    nodes = root / TOPOLOGY
    try:
        names = sorted((p for p in nodes.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    except OSError:
        return []
    gpus: list[DeviceFacts] = []
    for node in names:
        try:
            props = _properties(node / "properties")
        except OSError:
            continue
        version, minor = props.get("gfx_target_version", 0), props.get("drm_render_minor", 0)
        if not version or not (root / "dev/dri" / f"renderD{minor}").exists():
            continue  # a CPU node, or a GPU not given to this container
        gfx = gfx_name(version)
        gpus.append(DeviceFacts(index=len(gpus), name=_name(root, minor, gfx),
                                total_memory=_memory(node, props), gcn_arch_name=gfx))
    return gpus


def _pick(
    devices: list[DeviceFacts], variable: str, value: str
) -> tuple[list[DeviceFacts] | None, str | None]:
    entries = [e.strip() for e in value.split(",")]
    if not value.strip() or not all(e.isdigit() and int(e) < len(devices) for e in entries):
        return None, f"{variable}={value!r} is not a list of device indices here"
    if len(set(entries)) != len(entries):
        return None, f"{variable} names a device twice ({value})"
    return [devices[int(e)] for e in entries], None


def visible_gpus(
    gpus: Sequence[DeviceFacts], environ: Mapping[str, str]
) -> tuple[list[DeviceFacts] | None, str | None]:
    """(the GPUs HIP will show, numbered as torch numbers them; None and why when only torch can tell).

    Example:
        >>> gpus = [DeviceFacts(0, "AMD gfx90a", gcn_arch_name="gfx90a"),
        ...         DeviceFacts(1, "AMD gfx942", gcn_arch_name="gfx942")]
        >>> [d.name for d in visible_gpus(gpus, {"HIP_VISIBLE_DEVICES": "1"})[0]]
        ['AMD gfx942']
        >>> visible_gpus(gpus, {"ROCR_VISIBLE_DEVICES": "GPU-4a1c"})[1]
        "ROCR_VISIBLE_DEVICES='GPU-4a1c' is not a list of device indices here"
    """
    chosen: list[DeviceFacts] | None = list(gpus)
    for variable in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES" if "HIP_VISIBLE_DEVICES" in environ
                     else "CUDA_VISIBLE_DEVICES"):
        value = environ.get(variable)
        if value is not None and chosen is not None:
            chosen, why = _pick(chosen, variable, value)
            if chosen is None:
                return None, why
    return [DeviceFacts(index=i, name=d.name, total_memory=d.total_memory, gcn_arch_name=d.gcn_arch_name)
            for i, d in enumerate(chosen or [])], None
