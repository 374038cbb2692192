"""Sysfs and /dev trees laid out the way the kernel lays them out, for hosts we lack.

``bus/pci/devices/<addr>`` is a relative symlink into ``devices/pci0000:00/...`` (devices off
bus 00 behind a root port), holding ``vendor``, ``device`` and ``class`` files in the
kernel's format (``0x10de\\n``, ``0x030200\\n``).

Example:
    >>> make_sysfs(tmp_path / "sys", H200)
"""

from __future__ import annotations

import os
from pathlib import Path

# (address, vendor, device, class) as the kernel prints them.
H200 = ("0000:19:00.0", "0x10de", "0x2335", "0x030200")
MI300X = ("0000:0c:00.0", "0x1002", "0x74a1", "0x120000")
RADEON = ("0000:03:00.0", "0x1002", "0x744c", "0x030000")  # RX 7900 XTX, a VGA-class consumer card
MAX1550 = ("0000:29:00.0", "0x8086", "0x0bd5", "0x038000")  # Intel Data Center GPU Max
IGPU = ("0000:00:02.0", "0x8086", "0xa780", "0x030000")  # Intel UHD 770 on the CPU
HOST_BRIDGE = ("0000:00:00.0", "0x8086", "0x0d57", "0x060000")
USB = ("0000:00:14.0", "0x8086", "0x7ae0", "0x0c0330")
ROOT_PORT = ("0000:00:01.0", "0x8086", "0x0d58", "0x060400")


def make_sysfs(root: Path, *devices: tuple[str, str, str, str]) -> Path:
    """A sysfs tree under *root*: devices off bus 00 sit behind root port 0000:00:01.0, as on real hosts."""
    (root / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
    for address, vendor, device, pci_class in devices:
        bus = address.split(":")[1]
        parts = ["pci0000:00"] + ([] if bus == "00" else ["0000:00:01.0"]) + [address]
        real = root / "devices" / Path(*parts)
        real.mkdir(parents=True, exist_ok=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", pci_class)):
            (real / name).write_text(value + "\n")
        (real / "driver_override").write_text("(null)\n")
        # The kernel's link is relative: bus/pci/devices/X -> ../../../devices/pci0000:00/.../X
        os.symlink(Path("..", "..", "..", "devices", *parts), root / "bus" / "pci" / "devices" / address)
    return root


def make_dev(root: Path, *nodes: str, gid: int | None = None) -> Path:
    """A /dev tree with the named nodes (``nvidia0``, ``kfd``, ``dri/renderD128``) as plain files.

    Plain files stand in for character devices (mknod needs privileges the CI may lack);
    *gid* sets their owning group like the host's ``render`` group would.
    """
    root.mkdir(parents=True, exist_ok=True)
    for node in nodes:
        path = root / node
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        path.chmod(0o660)
        if gid is not None:
            os.chown(path, -1, gid)
    return root
