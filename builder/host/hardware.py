"""Find the host's GPUs from sysfs and /dev, and the groups a container needs to use them.

A GPU is a PCI function with an NVIDIA (0x10de), AMD (0x1002) or Intel (0x8086) vendor ID and
a display or accelerator class: 0x0300xx (VGA), 0x0302xx (3D), 0x0380xx (display, other) or
0x1200xx (processing accelerator). AMD and Intel also make host bridges, USB controllers and
the like, so the class is what decides, never the vendor alone.

A vendor is *present* when such a PCI function exists and *usable* when its driver's device
nodes exist too: NVIDIA ``/dev/nvidia[0-9]*`` (or an NVIDIA runtime/CDI spec the caller found),
AMD ``/dev/kfd`` and ``/dev/dri``, Intel ``/dev/dri/renderD*``.

Example:
    >>> host = detect()
    >>> host.usable()  # doctest: +SKIP
    ['nvidia']
    >>> choose_vendor(host)  # doctest: +SKIP
    ('nvidia', 'host has usable nvidia GPU(s): 0000:01:00.0 (0x2335)')
"""

from __future__ import annotations

import grp
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from builder.config.errors import UserError
from builder.host import cdi

GpuVendor = Literal["nvidia", "amd", "intel"]

#: PCI vendor IDs as sysfs writes them (``/sys/bus/pci/devices/*/vendor``).
PCI_VENDORS: dict[str, GpuVendor] = {"0x10de": "nvidia", "0x1002": "amd", "0x8086": "intel"}
#: Base class + subclass (the class value without its programming-interface byte).
GPU_CLASSES = {0x0300: "vga", 0x0302: "3d", 0x0380: "display", 0x1200: "accelerator"}
#: Preference when a host has several vendors: discrete accelerators before an Intel iGPU.
VENDOR_ORDER: tuple[GpuVendor, ...] = ("nvidia", "amd", "intel")
VENDOR_ENV = "BUILDER_VENDOR"
CDI_DIRS = cdi.CDI_DIRS


@dataclass(frozen=True)
class Gpu:
    """One GPU PCI function.

    Example:
        >>> Gpu("0000:01:00.0", "nvidia", "0x2335", "0x030200").kind
        '3d'
    """

    address: str
    vendor: GpuVendor
    device_id: str
    pci_class: str

    @property
    def kind(self) -> str:
        return GPU_CLASSES[int(self.pci_class, 16) >> 8]


@dataclass(frozen=True)
class DeviceNodes:
    """The GPU driver nodes under a dev root (paths as found, e.g. ``/dev/nvidia0``)."""

    root: str = "/dev"
    nvidia: tuple[str, ...] = ()
    kfd: str | None = None
    dri: str | None = None
    render: tuple[str, ...] = ()

    def host_path(self, device: str) -> Path:
        """Where a container device path (``/dev/kfd``) lies under this dev root."""
        return Path(self.root) / Path(device).relative_to("/dev")


@dataclass(frozen=True)
class HostGpus:
    """What :func:`detect` found: PCI GPUs, driver nodes, and whether an NVIDIA runtime/CDI is set up."""

    gpus: tuple[Gpu, ...] = ()
    nodes: DeviceNodes = DeviceNodes()
    nvidia_runtime: bool = False
    selinux: bool = False  # SELinux enforces its policy (podman then labels containers)

    def of(self, vendor: str) -> list[Gpu]:
        return [g for g in self.gpus if g.vendor == vendor]

    def present(self) -> list[GpuVendor]:
        """Vendors with at least one GPU on the PCI bus, in preference order."""
        return [v for v in VENDOR_ORDER if self.of(v)]

    def missing(self, vendor: str) -> list[str]:
        """What keeps a present vendor's GPUs from being usable (empty: usable)."""
        n = self.nodes
        if vendor == "nvidia":
            return (
                []
                if has_nvidia_gpu_node(n) or self.nvidia_runtime
                else ["/dev/nvidia[0-9]* (NVIDIA driver not loaded; nvidia-smi must work)"]
            )
        if vendor == "amd":
            return [
                p for p, ok in (("/dev/kfd (amdgpu driver with KFD)", n.kfd), ("/dev/dri", n.dri)) if not ok
            ]
        if vendor == "intel":
            return [] if n.render else ["/dev/dri/renderD* (i915 or xe driver not loaded)"]
        return []

    def usable(self) -> list[GpuVendor]:
        """Vendors whose GPUs are on the PCI bus and whose driver nodes exist, in preference order."""
        return [v for v in self.present() if not self.missing(v)]

    def describe(self, vendor: str) -> str:
        """Short list of one vendor's GPUs, e.g. ``0000:01:00.0 (0x2335)``."""
        return ", ".join(f"{g.address} ({g.device_id})" for g in self.of(vendor))


def _read(path: Path) -> str:
    return path.read_text(encoding="ascii").strip().lower()


def pci_gpus(sysfs_root: Path | str = "/sys") -> list[Gpu]:
    """GPUs on the PCI bus, from ``<sysfs_root>/bus/pci/devices/*/{vendor,device,class}``.

    Example:
        >>> pci_gpus("/sys")  # doctest: +SKIP
        [Gpu(address='0000:01:00.0', vendor='nvidia', device_id='0x2335', pci_class='0x030200')]
    """
    devices = Path(sysfs_root) / "bus" / "pci" / "devices"
    found = []
    for entry in sorted(devices.glob("*")):
        try:
            vendor = PCI_VENDORS.get(_read(entry / "vendor"))
            pci_class = _read(entry / "class")
            if vendor is None or int(pci_class, 16) >> 8 not in GPU_CLASSES:
                continue  # another vendor, or AMD/Intel bridges, USB, audio, ...
            found.append(Gpu(entry.name, vendor, _read(entry / "device"), pci_class))
        except (OSError, ValueError):
            continue  # a function going away or an unreadable file is not a GPU we can use
    return found


def device_nodes(dev_root: Path | str = "/dev") -> DeviceNodes:
    """The GPU driver nodes under *dev_root*, as absolute paths under it.

    Example:
        >>> device_nodes("/dev").kfd  # doctest: +SKIP
        '/dev/kfd'
    """
    root = Path(dev_root)
    nvidia = sorted(
        (p for p in root.glob("nvidia*") if p.name[6:].isdigit() or p.name == "nvidiactl"),
        key=lambda p: (p.name == "nvidiactl", len(p.name), p.name),
    )
    kfd, dri = root / "kfd", root / "dri"
    return DeviceNodes(
        root=str(root),
        nvidia=tuple(str(p) for p in nvidia),
        kfd=str(kfd) if kfd.exists() else None,
        dri=str(dri) if dri.is_dir() else None,
        render=tuple(str(p) for p in sorted(dri.glob("renderD*"))),
    )


def has_nvidia_gpu_node(nodes: DeviceNodes) -> bool:
    return any(Path(p).name != "nvidiactl" for p in nodes.nvidia)


def cdi_specs(dirs: Iterable[Path | str] = CDI_DIRS, kind: str = "nvidia.com/gpu") -> list[str]:
    """CDI spec files (YAML or JSON) declaring *kind*, e.g. from ``nvidia-ctk cdi generate`` (:mod:`.cdi`).

    Example:
        >>> cdi_specs()  # doctest: +SKIP
        ['/var/run/cdi/nvidia.yaml']
    """
    return [spec.path for spec in cdi.specs(dirs, kind)]


def detect(
    sysfs_root: Path | str = "/sys", dev_root: Path | str = "/dev", *, nvidia_runtime: bool | None = None
) -> HostGpus:
    """GPUs and driver nodes of this host.

    *nvidia_runtime*: whether the engine has the NVIDIA runtime or a CDI spec; by default,
    whether a CDI spec for ``nvidia.com/gpu`` exists (``builder doctor`` also asks the engine).

    Example:
        >>> detect("/sys", "/dev").present()  # doctest: +SKIP
        ['nvidia']
    """
    if nvidia_runtime is None:
        nvidia_runtime = bool(cdi_specs())
    return HostGpus(tuple(pci_gpus(sysfs_root)), device_nodes(dev_root), nvidia_runtime, selinux_enforcing(sysfs_root))


def selinux_enforcing(sysfs_root: Path | str = "/sys") -> bool:
    """Whether SELinux enforces its policy: ``<sysfs_root>/fs/selinux/enforce`` is ``1`` (the kernel's selinuxfs).

    Example:
        >>> selinux_enforcing("/sys")  # doctest: +SKIP
        False
    """
    try:
        return _read(Path(sysfs_root) / "fs" / "selinux" / "enforce") == "1"
    except (OSError, UnicodeError):
        return False


def choose_vendor(host: HostGpus, env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The vendor whose image this host should run, and why.

    Rule: ``BUILDER_VENDOR`` (nvidia|amd|intel|cpu) wins; else the first *usable* vendor in the
    order nvidia, amd, intel (a discrete accelerator beats an Intel iGPU beside it); else cpu.

    Example:
        >>> choose_vendor(HostGpus())
        ('cpu', 'no usable GPU on this host')
    """
    env = os.environ if env is None else env
    forced = env.get(VENDOR_ENV, "").strip().lower()
    if forced:
        if forced not in (*VENDOR_ORDER, "cpu"):
            raise UserError(
                f"{VENDOR_ENV}={forced!r} is not a vendor; use one of nvidia, amd, intel, cpu (or unset it)"
            )
        return forced, f"forced by {VENDOR_ENV}={forced}"
    usable = host.usable()
    if usable:
        vendor = usable[0]
        why = f"host has usable {vendor} GPU(s): {host.describe(vendor)}"
        others = usable[1:]
        return vendor, why + (f" (preferred over {', '.join(others)})" if others else "")
    unusable = [f"{v} GPU(s) {host.describe(v)} lack {'; '.join(host.missing(v))}" for v in host.present()]
    return "cpu", "no usable GPU on this host" + (f": {'; '.join(unusable)}" if unusable else "")


def group_gids(names: Iterable[str]) -> dict[str, int]:
    """GIDs of the named groups in the host's group database; names it lacks are left out.

    Example:
        >>> group_gids(["video", "render", "nosuchgroup"])  # doctest: +SKIP
        {'video': 44, 'render': 109}
    """
    found = {}
    for name in names:
        try:
            found[name] = grp.getgrnam(name).gr_gid
        except KeyError:
            continue
    return found


def device_gids(nodes: DeviceNodes) -> dict[str, int]:
    """Owning GID of /dev/kfd and each /dev/dri/renderD* node.

    These are what a container user needs: the host's ``render`` GID (often 109 or 110)
    rarely equals the image's, so the launcher adds the host's number, never a name.

    Example:
        >>> device_gids(device_nodes())  # doctest: +SKIP
        {'/dev/kfd': 109, '/dev/dri/renderD128': 109}
    """
    paths = ([nodes.kfd] if nodes.kfd else []) + list(nodes.render)
    found = {}
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            continue
        if stat.S_ISCHR(info.st_mode) or stat.S_ISREG(info.st_mode):  # regular: a test's fake node
            found[path] = info.st_gid
    return found


def container_gids(group_names: Iterable[str], nodes: DeviceNodes) -> list[int]:
    """GIDs to add to a container (``--group-add``): the named host groups plus the nodes' owners.

    GID 0 is left out: a node owned by root's group is a misconfigured host, and giving the
    container user root's group would hide that.

    Example:
        >>> container_gids(["video", "render"], device_nodes())  # doctest: +SKIP
        [44, 109]
    """
    gids = set(group_gids(group_names).values()) | set(device_gids(nodes).values())
    return sorted(g for g in gids if g != 0)
