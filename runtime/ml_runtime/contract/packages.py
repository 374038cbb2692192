"""The ``dependencies`` of a contract: installed and in range, torch.distributed, the official wheel.

Example:
    >>> from ml_runtime.devices.probe import ProbeResult
    >>> check_dependency(Dependency("packaging", None, False, "d"), ProbeResult("none", "cpu")).ok
    True
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from collections.abc import Mapping

from packaging.version import InvalidVersion, Version

from ml_runtime.contract.result import CheckResult
from ml_runtime.contract.spec import Dependency
from ml_runtime.devices.probe import ProbeResult


def installed_version(dep: Dependency, probe: ProbeResult) -> tuple[str | None, str | None]:
    """(version, problem) of a dependency; torch comes from the probe.

    Example:
        >>> installed_version(Dependency("packaging", None, False, "d"), None)[0] is not None
        True
    """
    if dep.is_torch:
        version = probe.torch.get("version")
        return (
            (version, None)
            if version
            else (None, probe.torch.get("import_error") or "torch is not importable")
        )
    try:
        return importlib.metadata.version(dep.name), None
    except importlib.metadata.PackageNotFoundError:
        return None, "not installed"


def check_dependency(dep: Dependency, probe: ProbeResult) -> CheckResult:
    """A dependency is installed and in range (local ``+cpu`` etc. ignored).

    Example:
        >>> from packaging.specifiers import SpecifierSet
        >>> from ml_runtime.devices.probe import ProbeResult
        >>> p = ProbeResult("none", "cpu", torch={"version": "2.13.0+cpu"})
        >>> dep = Dependency("pytorch", SpecifierSet(">=2.1.0,<2.2.0"), True, "d", ">=2.1.0,<2.2.0")
        >>> check_dependency(dep, p).line("strict")
        '[CHECK] pytorch: 2.13.0+cpu -> FAIL (requires pytorch >=2.1.0,<2.2.0)'
    """
    rng = dep.range_text or (str(dep.version_range) if dep.version_range is not None else "")
    need = f"{dep.name} {rng}".strip()
    hint = f"install {dep.name}{' ' + rng if rng else ''} in the image"
    version, problem = installed_version(dep, probe)
    if version is None:
        return CheckResult(dep.name, "not available", False, need, f"requires {need}: {problem}", hint)
    if dep.version_range is None:
        return CheckResult(dep.name, version, True, need)
    try:
        # Compare the public version: "2.1.2+cu121" is 2.1.2 for range purposes;
        # pre-releases (nightlies) are allowed to match.
        public = Version(Version(version).public)
    except InvalidVersion:
        return CheckResult(dep.name, version, False, need, f"cannot parse version {version!r}", hint)
    if dep.version_range.contains(public, prereleases=True):
        return CheckResult(dep.name, version, True, need)
    return CheckResult(dep.name, version, False, need, f"requires {need}", f"{hint} (found {version})")


def check_distribution(dep: Dependency, probe: ProbeResult) -> CheckResult:
    """``full_distribution``: torch.distributed plus this host's backend.

    Example:
        >>> from ml_runtime.devices.probe import ProbeResult
        >>> p = ProbeResult("none", "cpu", torch={"version": "2.13.0+cpu"}, distributed_available=True,
        ...                 distributed_backends={"gloo": True})
        >>> check_distribution(Dependency("pytorch", None, True, "d"), p).line("strict")
        '[CHECK] pytorch.full_distribution: torch.distributed (gloo) -> OK'
    """
    item = f"{dep.name}.full_distribution"
    backend = probe.distributed_backend
    need = f"torch.distributed with the {backend} backend"
    hint = f"install a torch build with torch.distributed and {backend}"
    if backend == "ccl":
        hint = "install oneccl_bindings_for_pytorch, or torch >= 2.8 for the built-in xccl backend"
    if not probe.torch.get("version"):
        return CheckResult(item, "torch not importable", False, need, f"requires {need}", hint)
    if not probe.distributed_available:
        return CheckResult(
            item,
            "torch.distributed unavailable",
            False,
            need,
            "requires torch.distributed but this torch build has it disabled",
            hint,
        )
    available = sorted(name for name, ok in probe.distributed_backends.items() if ok)
    found = f"torch.distributed ({', '.join(available) or 'no backends'})"
    if probe.distributed_backends.get(backend):
        return CheckResult(item, found, True, need)
    return CheckResult(item, found, False, need, f"requires the {backend} backend for {probe.backend}", hint)


#: Local labels of the official PyTorch indexes (PyPI's default CUDA build carries none in its
#: metadata but reports e.g. +cu130 in torch.__version__).
_OFFICIAL_LOCAL = re.compile(r"^(cpu|cu\d{2,3}|rocm\d+(\.\d+){1,2}|xpu)$")

#: Set in every image by the builder from wheel-mapping.json: the torch pin and its build flavour.
WHEEL_VARIABLES = ("ML_RUNTIME_TORCH", "ML_RUNTIME_FLAVOUR")


def check_wheel(dep: Dependency, probe: ProbeResult, environ: Mapping[str, str] | None = None) -> CheckResult:
    """``vendor_agnostic_wheel``: torch is the official build the image's wheel mapping names.

    In an image built by ml-image-builder, ``ML_RUNTIME_TORCH`` and ``ML_RUNTIME_FLAVOUR``
    name the mapped torch and flavour (e.g. ``2.14.1`` and ``cuda 13.0``); torch must be that
    public version and flavour. Elsewhere torch must at least be an official index build
    (``+cpu``, ``+cuXYZ``, ``+rocmX.Y``, ``+xpu`` or none), not a vendor fork such as
    ``2.5.0a0+872d972e41.nv24.08``.

    Example:
        >>> from ml_runtime.devices.probe import ProbeResult
        >>> p = ProbeResult("none", "cpu", torch={"version": "2.13.0+cpu", "flavour": "cpu"})
        >>> check_wheel(Dependency("pytorch", None, False, "d"), p, {"ML_RUNTIME_TORCH": "2.13.0+cpu",
        ...             "ML_RUNTIME_FLAVOUR": "cpu"}).line("strict")
        '[CHECK] pytorch.vendor_agnostic_wheel: 2.13.0+cpu (cpu) -> OK'
    """
    env = os.environ if environ is None else environ
    item = f"{dep.name}.vendor_agnostic_wheel"
    version, flavour = probe.torch.get("version"), probe.torch.get("flavour")
    if not version:
        return CheckResult(item, "torch not importable", False, "an official torch wheel",
                           "requires torch", "install torch from the index the wheel mapping names")
    found = f"{version} ({flavour})"
    want_version, want_flavour = env.get("ML_RUNTIME_TORCH"), env.get("ML_RUNTIME_FLAVOUR")
    hint = "rebuild the image (builder build) so torch comes from the index wheel-mapping.json names"
    try:
        parsed = Version(version)
    except InvalidVersion:
        return CheckResult(item, found, False, "an official torch wheel", f"cannot parse {version!r}", hint)
    if want_version and want_flavour:
        need = f"torch {Version(want_version).public} ({want_flavour}) from the image's wheel mapping"
        ok = parsed.public == Version(want_version).public and flavour == want_flavour
        return CheckResult(item, found, ok, need, None if ok else f"requires {need}", None if ok else hint)
    need = "an official PyTorch index build (+cpu, +cuXYZ, +rocmX.Y, +xpu or PyPI's)"
    if parsed.local is None or _OFFICIAL_LOCAL.match(parsed.local):
        return CheckResult(item, found, True, need)
    return CheckResult(item, found, False, need, f"requires {need}; +{parsed.local} is a vendor build",
                       "install torch from the official index for this accelerator")
