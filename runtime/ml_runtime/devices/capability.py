"""Per-vendor GPU architecture identifiers and how they are compared.

A capability is never compared across vendors: ``sm_80`` only means something
on an NVIDIA GPU, ``gfx90a`` only on an AMD GPU.

Decisions (documented because vendors do not define a "minimum"):

* NVIDIA ``sm_XY`` is compute capability X.Y; the last digit is the minor, the
  rest the major (``sm_80`` = 8.0, ``sm_100`` = 10.0, ``sm_121`` = 12.1).
  Plain ``sm_XY`` means "X.Y or newer". ``sm_XYa`` (architecture-specific
  features, e.g. ``sm_90a``) is not forward compatible, so it means exactly X.Y.
  ``sm_XYf`` (family-specific) means the same major and a minor >= Y.
* AMD ``gfx`` names follow LLVM: ``gfx`` + major (decimal, 1-2 digits) + minor
  (one hex digit) + stepping (one hex digit): gfx908 = (9, 0, 8), gfx90a =
  (9, 0, 10), gfx942 = (9, 4, 2), gfx1100 = (11, 0, 0). Within one major (one
  family: gfx9 = GCN/CDNA, gfx10/11/12 = RDNA generations) names are ordered by
  (minor, stepping), so gfx942 > gfx90a > gfx908. Different majors are never
  ordered: an RDNA gfx1100 does not satisfy a CDNA gfx90a requirement. Known
  limit: the gfx9 family also holds APUs (gfx90c sorts above gfx90a).
  Target feature flags (``gfx942:sramecc+:xnack-``) are ignored for ordering.
* Intel GPUs have no public ordering; a requirement is either a family name
  (``pvc`` = Data Center GPU Max, ``dg2`` = Arc A-series / Data Center Flex,
  ``bmg`` = Arc B-series) or an exact PCI device id such as ``0x0bd5``; both
  are matched for equality.

Example:
    >>> need = parse_capability("sm_80")
    >>> satisfies(nvidia_capability(9, 0), need)[0]
    True
    >>> satisfies(amd_capability("gfx90a:sramecc+:xnack-"), need)[1]
    'requires an NVIDIA GPU (sm_80) but found AMD gfx90a'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

VENDOR_LABEL = {"nvidia": "NVIDIA", "amd": "AMD", "intel": "Intel", "none": "no accelerator"}

EXPECTED_FORMS = (
    "expected sm_XY, gfxNNN[a-z] or an Intel family (pvc, dg2, bmg; or Xe_HPC, Xe_HPG, Xe2_HPG) "
    "/ device id 0xNNNN"
)
#: Intel's architecture names for the families (the design notes write "Xe_HPG").
INTEL_ARCH_ALIASES = {"xe_hpc": "pvc", "xe_hpg": "dg2", "xe2_hpg": "bmg"}

_SM = re.compile(r"^sm_(\d{2,3})([af]?)$")
_GFX = re.compile(r"^gfx(\d{1,2})([0-9a-f])([0-9a-f])$")
_INTEL_ID = re.compile(r"^0x([0-9a-f]{1,4})$")
_NAME_ID = re.compile(r"\[0x([0-9a-fA-F]{3,4})\]")

# PCI device id ranges per Intel family (best effort, from the Linux i915/xe id
# tables); unknown ids get family None and only match an exact id requirement.
INTEL_FAMILIES: dict[str, tuple[tuple[int, int], ...]] = {
    "pvc": ((0x0BD0, 0x0BDB), (0x0B69, 0x0B69), (0x0B6E, 0x0B6E)),
    "dg2": ((0x5690, 0x56CF),),
    "bmg": ((0xE202, 0xE2FF),),
}
INTEL_FAMILY_TITLES = {
    "pvc": "Data Center GPU Max (Ponte Vecchio)",
    "dg2": "Arc A-series / Data Center GPU Flex (DG2)",
    "bmg": "Arc B-series (Battlemage)",
}
# Fallback when only the marketing name is known.
_INTEL_NAME_HINTS = (("max 1", "pvc"), ("flex", "dg2"), ("arc(tm) a", "dg2"), ("arc(tm) b", "bmg"))


@dataclass(frozen=True)
class Capability:
    """A vendor-specific architecture identifier.

    ``version`` is (major, minor) for NVIDIA, (major, minor, stepping) for AMD
    and empty for Intel. ``variant`` is the NVIDIA suffix ("", "a" or "f").

    Example:
        >>> parse_capability("gfx942").version
        (9, 4, 2)
    """

    vendor: str
    text: str
    version: tuple[int, ...] = ()
    variant: str = ""
    family: str | None = None
    device_id: int | None = None

    def describe(self) -> str:
        """Human form with the vendor, e.g. ``NVIDIA sm_90``.

        Example:
            >>> parse_capability("0x0bd5").describe()
            'Intel 0x0bd5 (pvc)'
        """
        if self.vendor == "intel" and self.device_id is not None and self.family:
            return f"Intel {self.text} ({self.family})"
        return f"{VENDOR_LABEL[self.vendor]} {self.text}"


def parse_capability(value: str) -> Capability:
    """Parse a requirement string; raises ValueError naming the expected forms.

    Example:
        >>> parse_capability("sm_90a").variant
        'a'
        >>> parse_capability("Xe_HPG").family
        'dg2'
        >>> parse_capability("sm8")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: 'sm8' is not a valid compute capability (expected sm_XY, gfxNNN[a-z] or ...)
    """
    text = str(value).strip().lower()
    match = _SM.match(text)
    if match:
        digits, variant = match.groups()
        return Capability("nvidia", text, (int(digits[:-1]), int(digits[-1])), variant)
    match = _GFX.match(text)
    if match:
        major, minor, stepping = match.groups()
        return Capability("amd", text, (int(major), int(minor, 16), int(stepping, 16)))
    text = INTEL_ARCH_ALIASES.get(text, text)
    if text in INTEL_FAMILIES:
        return Capability("intel", text, family=text)
    match = _INTEL_ID.match(text)
    if match:
        device_id = int(match.group(1), 16)
        return Capability("intel", f"0x{device_id:04x}", family=intel_family(device_id), device_id=device_id)
    raise ValueError(f"{value!r} is not a valid compute capability ({EXPECTED_FORMS})")


def nvidia_capability(major: int, minor: int) -> Capability:
    """Capability of an NVIDIA device from its (major, minor).

    Example:
        >>> nvidia_capability(8, 6).text
        'sm_86'
    """
    return Capability("nvidia", f"sm_{major}{minor}", (major, minor))


def amd_capability(gcn_arch_name: str | None) -> Capability | None:
    """Capability of an AMD device from ``gcnArchName`` (feature flags dropped).

    Example:
        >>> amd_capability("gfx942:sramecc+:xnack-").version
        (9, 4, 2)
    """
    if not gcn_arch_name:
        return None
    base = gcn_arch_name.split(":", 1)[0].strip().lower()
    match = _GFX.match(base)
    if not match:
        return None
    major, minor, stepping = match.groups()
    return Capability("amd", base, (int(major), int(minor, 16), int(stepping, 16)))


def intel_family(device_id: int | None, name: str | None = None) -> str | None:
    """Intel family for a PCI device id (or, failing that, the device name).

    Example:
        >>> intel_family(0x56C0), intel_family(None, "Intel(R) Data Center GPU Max 1550")
        ('dg2', 'pvc')
    """
    if device_id is not None:
        for family, ranges in INTEL_FAMILIES.items():
            if any(low <= device_id <= high for low, high in ranges):
                return family
    lowered = (name or "").lower()
    for hint, family in _INTEL_NAME_HINTS:
        if hint in lowered:
            return family
    return None


def intel_device_id_from_name(name: str | None) -> int | None:
    """Device id embedded in names like ``Intel(R) Graphics [0x56c0]``.

    Example:
        >>> hex(intel_device_id_from_name("Intel(R) Graphics [0x56c0]"))
        '0x56c0'
    """
    match = _NAME_ID.search(name or "")
    return int(match.group(1), 16) if match else None


def intel_capability(device_id: int | None, name: str | None = None) -> Capability:
    """Capability of an Intel device from its PCI device id and name.

    Example:
        >>> intel_capability(0x0BD5).describe()
        'Intel 0x0bd5 (pvc)'
    """
    if device_id is None:
        device_id = intel_device_id_from_name(name)
    family = intel_family(device_id, name)
    text = f"0x{device_id:04x}" if device_id is not None else (family or "unknown")
    return Capability("intel", text, family=family, device_id=device_id)


def version_text(cap: Capability) -> str:
    """Dotted compute capability for NVIDIA, else the identifier.

    Example:
        >>> version_text(parse_capability("sm_120"))
        '12.0'
    """
    if cap.vendor == "nvidia":
        return f"{cap.version[0]}.{cap.version[1]}"
    return cap.text


def satisfies(found: Capability, required: Capability) -> tuple[bool, str]:
    """Whether ``found`` meets ``required``; the string explains a failure.

    Example:
        >>> satisfies(parse_capability("gfx942"), parse_capability("gfx90a"))
        (True, '')
        >>> print(satisfies(parse_capability("gfx1100"), parse_capability("gfx90a"))[1])
        requires gfx90a or newer of the AMD gfx9 family but found gfx1100 (gfx11 family; ...)
    """
    if found.vendor != required.vendor:
        return False, (
            f"requires an {VENDOR_LABEL[required.vendor]} GPU ({required.text}) but found {found.describe()}"
        )
    if required.vendor == "nvidia":
        return _nvidia_satisfies(found, required)
    if required.vendor == "amd":
        if found.version[0] != required.version[0]:
            return False, (
                f"requires {required.text} or newer of the AMD gfx{required.version[0]} family "
                f"but found {found.text} (gfx{found.version[0]} family; "
                "different AMD families are not ordered)"
            )
        if found.version[1:] < required.version[1:]:
            return False, f"requires {required.text} or newer but found {found.text}"
        return True, ""
    return _intel_satisfies(found, required)


def _nvidia_satisfies(found: Capability, required: Capability) -> tuple[bool, str]:
    need = version_text(required)
    have = f"{found.text} ({version_text(found)})"
    if required.variant == "a":
        ok = found.version == required.version
        return (
            ok,
            "" if ok else f"requires exactly compute capability {need} ({required.text}) but found {have}",
        )
    if required.variant == "f":
        ok = found.version[0] == required.version[0] and found.version[1] >= required.version[1]
        return ok, "" if ok else (
            f"requires compute capability {required.version[0]}.x >= {need} ({required.text}) "
            f"but found {have}"
        )
    ok = found.version >= required.version
    return ok, "" if ok else f"requires compute capability >= {need} ({required.text}) but found {have}"


def _intel_satisfies(found: Capability, required: Capability) -> tuple[bool, str]:
    if required.device_id is not None:
        ok = found.device_id == required.device_id
        return ok, "" if ok else f"requires Intel device {required.text} but found {found.describe()}"
    if found.family is None:
        return False, (
            f"requires the Intel {required.family} family but the family of {found.describe()} "
            "is unknown to this checker (require its device id instead)"
        )
    ok = found.family == required.family
    return ok, "" if ok else f"requires the Intel {required.family} family but found {found.describe()}"


def suggestion(required: Capability) -> str:
    """What host would satisfy ``required``, for the one-line hint.

    Example:
        >>> suggestion(parse_capability("sm_80"))
        'run on a host with an NVIDIA GPU of compute capability >= 8.0'
    """
    if required.vendor == "nvidia":
        if required.variant == "a":
            return f"run on a host with an NVIDIA GPU of compute capability exactly {version_text(required)}"
        return f"run on a host with an NVIDIA GPU of compute capability >= {version_text(required)}"
    if required.vendor == "amd":
        return (
            f"run on a host with an AMD GPU {required.text} or newer of the gfx{required.version[0]} family"
        )
    if required.device_id is not None:
        return f"run on a host with the Intel GPU {required.text}"
    return (
        f"run on a host with an Intel {INTEL_FAMILY_TITLES.get(required.family or '', required.family)} GPU"
    )
