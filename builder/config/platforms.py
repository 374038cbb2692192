"""OCI platforms (``linux/amd64``, ``linux/arm64``): the host's, and the names each tool wants.

A platform is written as OCI writes it. The same machine is ``x86_64``/``aarch64`` to the
kernel, pip's manylinux tags and qemu, and ``amd64``/``arm64`` to OCI, Debian and file names.

Example:
    >>> machine("linux/arm64"), arch("linux/arm64")
    ('aarch64', 'arm64')
"""

from __future__ import annotations

import platform as _platform
from pathlib import Path

#: OCI architecture -> the kernel's machine name (uname -m; also pip's and qemu's).
MACHINE = {"amd64": "x86_64", "arm64": "aarch64"}
#: Where the kernel lists its binfmt_misc handlers (qemu-aarch64, qemu-x86_64, ...).
BINFMT = Path("/proc/sys/fs/binfmt_misc")


def arch(platform: str) -> str:
    """The OCI architecture of a platform: ``linux/arm64`` -> ``arm64`` (Debian's name too)."""
    return platform.split("/")[1]


def machine(platform: str) -> str:
    """The kernel's machine name of a platform: ``linux/amd64`` -> ``x86_64``."""
    return MACHINE[arch(platform)]


def host_platform() -> str:
    """The platform this host runs natively.

    Example:
        >>> host_platform() in ("linux/amd64", "linux/arm64")
        True
    """
    name = _platform.machine()  # x86_64/aarch64 on Linux; a name already in OCI's form maps to itself
    return f"linux/{ {m: a for a, m in MACHINE.items()}.get(name, name) }"


#: The CPU qemu emulates for a foreign platform's containers, where its default ('max') misleads
#: torch: on qemu 7.2 the aarch64 torch's GEMM kernels for the SVE/SME that 'max' advertises gave
#: [[0, 0], [0, 9]] for a 2x3 @ 3x2 product; a Neoverse N1 (no SVE) computes it right.
QEMU_CPU = {"linux/arm64": "neoverse-n1"}


#: The entrypoint's probe timeout under qemu (seconds): what it was before it was bounded for real hosts.
EMULATED_PROBE_TIMEOUT_S = 600


def emulated_env(platform: str) -> list[str]:
    """Environment entries for a container of *platform* run under qemu (docker-py ``environment``).

    ``TINI_SUBREAPER`` without a value removes the image's: qemu-user does not implement
    prctl(PR_SET_CHILD_SUBREAPER), which tini makes fatal (and tini is PID 1 there anyway).
    ``RUNTIME_PROBE_TIMEOUT``: importing torch under qemu takes a minute, not the few seconds the
    entrypoint's probe allows a real machine.

    Example:
        >>> emulated_env("linux/arm64")
        ['TINI_SUBREAPER', 'RUNTIME_PROBE_TIMEOUT=600', 'QEMU_CPU=neoverse-n1']
    """
    return ["TINI_SUBREAPER", f"RUNTIME_PROBE_TIMEOUT={EMULATED_PROBE_TIMEOUT_S}"] + (
        [f"QEMU_CPU={QEMU_CPU[platform]}"] if platform in QEMU_CPU else [])


def emulation_problem(platform: str, binfmt: Path = BINFMT) -> str | None:
    """None when this host can run *platform*'s binaries (native, or qemu registered with binfmt_misc
    and the F flag, which containers need); else what is missing and the fix, in one line."""
    if platform == host_platform():
        return None
    handler = binfmt / f"qemu-{machine(platform)}"
    fix = ("apt-get install qemu-user-static, mount binfmt_misc (mount -t binfmt_misc binfmt_misc "
           f"{BINFMT}) and register it (scripts/setup-host.sh does all three as root)")
    try:
        text = handler.read_text()
    except OSError:
        return f"{platform} needs emulation, but binfmt_misc has no qemu-{machine(platform)} handler: {fix}"
    flags = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("flags:")), "")
    if not text.startswith("enabled"):
        return f"{platform} needs emulation, but the qemu-{machine(platform)} handler is disabled: {fix}"
    if "F" not in flags:
        return (f"{platform} needs emulation, but qemu-{machine(platform)} is registered without the F flag "
                f"(containers cannot use it): {fix}")
    return None
