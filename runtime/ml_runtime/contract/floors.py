"""The oldest host driver the image's torch build runs on, and ``host_driver``, the check of it.

The floors are data (``ml_runtime/driver-floors.json``): per CUDA series the driver it needs with
NVIDIA's minor-version compatibility (13.x: >= 580, 12.x: >= 525, 11.x: >= 450.80.02) and the image
built for that series; per CUDA release the driver of its own full feature set. Under CDI nothing
else checks it (the legacy hook's ``NVIDIA_REQUIRE_CUDA`` is never read), and torch on a driver that
is too old only warns and falls back to the CPU. ROCm's rule (its user space within two releases of
the kernel driver's) cannot be read off the amdgpu version, so it is reported, not compared.

Example:
    >>> floor_for("13.0").minimum, floor_for("13.0").release_minimum
    ('580', '580.65.06')
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ml_runtime.contract.fields import version_at_least, version_tuple
from ml_runtime.contract.result import CheckResult
from ml_runtime.contract.spec import Dependency
from ml_runtime.devices.probe import ProbeResult

FLOORS_PATH = Path(__file__).resolve().parents[1] / "driver-floors.json"


@dataclass(frozen=True)
class Floor:
    """What one CUDA release of a torch build needs of the host's NVIDIA driver.

    Example:
        >>> Floor("13.0", "13", "580", "580.65.06", "nvidia-cu130").need
        'NVIDIA driver >= 580 (CUDA 13.x)'
    """

    cuda: str
    series: str
    minimum: str | None  # the series' floor (minor-version compatibility); None: not in the table
    release_minimum: str | None  # the release's own, full feature set
    image: str | None  # the target built for this series

    @property
    def need(self) -> str:
        """``NVIDIA driver >= 580 (CUDA 13.x)``."""
        return f"NVIDIA driver >= {self.minimum} (CUDA {self.series}.x)"


@lru_cache(maxsize=4)
def load_floors(path: Path = FLOORS_PATH) -> dict[str, Any]:
    """The table (read once; a few hundred bytes of JSON).

    Example:
        >>> sorted(load_floors()["cuda"]["series"])[-1]
        '13'
    """
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def floor_for(cuda: str, table: dict[str, Any] | None = None) -> Floor:
    """The floor of CUDA release ``cuda`` (``"13.0"``); ``minimum`` is None for a series not in the table.

    Example:
        >>> floor_for("12.8").minimum, floor_for("12.1").release_minimum, floor_for("14.0").minimum
        ('525', None, None)
    """
    data = (table or load_floors())["cuda"]
    series = cuda.split(".")[0]
    entry = data["series"].get(series, {})
    return Floor(cuda, series, entry.get("driver"), data["release"].get(cuda), entry.get("image"))


def runnable_series(driver: str, table: dict[str, Any] | None = None) -> tuple[str, str, str | None] | None:
    """(series, its floor, its image) of the newest CUDA series ``driver`` runs; None below them all.

    Example:
        >>> runnable_series("535.54.03")
        ('12', '525', 'nvidia-cu126')
        >>> runnable_series("418.67") is None
        True
    """
    found = version_tuple(driver)
    series = (table or load_floors())["cuda"]["series"]
    for name in sorted(series, key=int, reverse=True):
        if version_at_least(found, version_tuple(series[name]["driver"])):
            return name, series[name]["driver"], series[name].get("image")
    return None


def check_host_driver(
    dep: Dependency, probe: ProbeResult, table: dict[str, Any] | None = None
) -> CheckResult:
    """``host_driver``: the host's driver is at least what the torch build's CUDA needs.

    Example:
        >>> p = ProbeResult("nvidia", "cuda", torch={"version": "2.14.1+cu130", "cuda": "13.0"},
        ...                 driver_version="535.54.03", driver_source="nvml")
        >>> result = check_host_driver(Dependency("pytorch", None, False, "d"), p)
        >>> result.line("strict")
        '[CHECK] pytorch.host_driver: 535.54.03 (nvml) -> FAIL (CUDA 13.0 needs an NVIDIA driver >= 580)'
        >>> result.suggestion  # doctest: +NORMALIZE_WHITESPACE
        'the NVIDIA driver 535.54.03 is older than CUDA 13.0 of this image needs (>= 580): upgrade the
         driver to >= 580, or run the image built for CUDA 12.x (e.g. nvidia-cu126), which runs on >= 525'
    """
    item = f"{dep.name}.host_driver"
    cuda, hip = probe.torch.get("cuda"), probe.torch.get("hip")
    if not probe.torch.get("version"):
        return CheckResult(item, "torch not importable", False, "torch", "requires torch",
                           "install torch in the image")
    if hip:
        rule = (table or load_floors())["rocm"]["rule"]
        found = f"{probe.driver_version or 'amdgpu version unknown'} (ROCm {hip}: not compared)"
        return CheckResult(item, found, True, f"a kernel driver for ROCm {hip}: {rule}")
    if not cuda:
        return CheckResult(item, f"{probe.torch.get('flavour')} build: no driver floor", True, "none")
    floor = floor_for(cuda, table)
    if floor.minimum is None:
        found = f"{probe.driver_version or 'unknown'}; no floor recorded for CUDA {floor.series}.x"
        return CheckResult(item, found, True, "a floor in driver-floors.json")
    if not probe.driver_version:
        why = "no NVIDIA driver here" if probe.vendor != "nvidia" else "driver version unknown, not checked"
        return CheckResult(item, f"{why} (CUDA {cuda} build)", True, floor.need)
    return _compare(item, probe, floor, table)


def _compare(item: str, probe: ProbeResult, floor: Floor, table: dict[str, Any] | None) -> CheckResult:
    driver = probe.driver_version or ""
    found = f"{driver} ({probe.driver_source})"
    have = version_tuple(driver)
    if not version_at_least(have, version_tuple(floor.minimum)):
        fix = f"upgrade the driver to >= {floor.minimum}"
        older = runnable_series(driver, table)
        if older is not None:
            series, minimum, image = older
            fix += f", or run the image built for CUDA {series}.x" + (f" (e.g. {image})" if image else "")
            fix += f", which runs on >= {minimum}"
        return CheckResult(
            item, found, False, floor.need, f"CUDA {floor.cuda} needs an NVIDIA driver >= {floor.minimum}",
            f"the NVIDIA driver {driver} is older than CUDA {floor.cuda} of this image needs "
            f"(>= {floor.minimum}): {fix}",
        )
    if floor.release_minimum and not version_at_least(have, version_tuple(floor.release_minimum)):
        found += (f"; CUDA {floor.cuda} through minor-version compatibility (a limited feature set; "
                  f"its own driver is >= {floor.release_minimum})")
    return CheckResult(item, found, True, floor.need)
