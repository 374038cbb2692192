"""The runtime contract (``runtime-spec.yaml``) as the checks read it: :class:`Spec`, and the modes.

Format (exactly what users write)::

    required_features:
      - gpu_compute_capability: "sm_80"   # or gfx90a, or an Intel family/device id
      - memory_bandwidth_gbps: 2000       # or "auto": measure and report
      - driver_version_min: "535.54.03"   # or {nvidia: "535.54.03", amd: "6.8.5"}
      - device_memory_gb: 40              # GB = 10**9 bytes
    dependencies:
      - name: pytorch
        version_range: ">=2.1.0,<2.2.0"
        full_distribution: true           # torch.distributed with this host's backend
        vendor_agnostic_wheel: true       # torch is the official build the image's wheel mapping names
        host_driver: true                 # the host's driver runs torch's CUDA (driver-floors.json)
    mode: strict                          # strict | warn | off

Which file is used, and reading it: :mod:`ml_runtime.contract.locate`. A file is validated into
a :class:`Spec` by :func:`~ml_runtime.contract.spec_file.parse_spec` (pydantic models, imported
only then); every problem is one line ``FILE: KEY.PATH: problem`` raised as
:class:`~ml_runtime.errors.ConfigError`. The image's own default spec is validated once, at image
build (:mod:`ml_runtime.contract.record`): a container start that uses it unchanged reads the
record instead (no pydantic, no YAML). Any other file is validated in full every time.

Example:
    >>> spec = Spec(source="runtime-spec.yaml", features={"device_memory_gb": 40.0})
    >>> spec.features["device_memory_gb"], spec.mode, spec.required_vendor
    (40.0, 'strict', None)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet

from ml_runtime.devices.capability import Capability
from ml_runtime.errors import ConfigError

DEFAULT_SPEC_PATH = Path(__file__).resolve().parents[1] / "default-spec.yaml"
MODES = ("strict", "warn", "off")
TORCH_NAMES = ("pytorch", "torch")


@dataclass(frozen=True)
class DriverRequirement:
    """Minimum driver version, for any vendor (key ``None``) or per vendor.

    Example:
        >>> DriverRequirement({None: "535.54.03"}).for_vendor("nvidia")
        '535.54.03'
    """

    minimums: Mapping[str | None, str]

    def for_vendor(self, vendor: str) -> str | None:
        """The minimum that applies to ``vendor`` (None: no requirement)."""
        return self.minimums.get(vendor, self.minimums.get(None))


@dataclass(frozen=True)
class Dependency:
    """One ``dependencies`` entry.

    Example:
        >>> Dependency("pytorch", SpecifierSet(">=2.0"), True, "dependencies[0]").is_torch
        True
    """

    name: str
    version_range: SpecifierSet | None
    full_distribution: bool
    path: str
    range_text: str | None = None  # as the user wrote it (SpecifierSet reorders)
    vendor_agnostic_wheel: bool = False
    host_driver: bool = False

    @classmethod
    def of(cls, name: str, range_text: str | None, full_distribution: bool, vendor_agnostic_wheel: bool,
           path: str, host_driver: bool = False) -> Dependency:
        """A validated entry's values (the range as written) as a Dependency.

        Example:
            >>> Dependency.of("torch", ">=2.1", False, False, "dependencies[0]").version_range.contains("2.2")
            True
        """
        version_range = SpecifierSet(range_text) if range_text is not None else None
        return cls(
            name, version_range, full_distribution, path, range_text, vendor_agnostic_wheel, host_driver
        )

    @property
    def is_torch(self) -> bool:
        """True for ``pytorch``/``torch`` (checked through torch itself)."""
        return self.name.lower() in TORCH_NAMES


@dataclass(frozen=True)
class Spec:
    """A validated runtime contract. ``features`` keeps the file's order.

    Feature values: ``gpu_compute_capability`` -> Capability,
    ``memory_bandwidth_gbps`` -> float or "auto", ``driver_version_min`` ->
    DriverRequirement, ``device_memory_gb`` -> float.

    Example:
        >>> Spec(source="x.yaml").mode
        'strict'
    """

    source: str
    features: dict[str, Any] = field(default_factory=dict)
    dependencies: tuple[Dependency, ...] = ()
    mode: str = "strict"

    @property
    def required_vendor(self) -> str | None:
        """Vendor implied by ``gpu_compute_capability`` (None if absent)."""
        cap = self.features.get("gpu_compute_capability")
        return cap.vendor if isinstance(cap, Capability) else None


def env_mode(environ: Mapping[str, str] | None = None) -> str | None:
    """Mode from ``$RUNTIME_CHECK_MODE`` (None when unset; invalid -> ConfigError).

    Example:
        >>> env_mode({"RUNTIME_CHECK_MODE": "WARN"})
        'warn'
    """
    env = os.environ if environ is None else environ
    raw = env.get("RUNTIME_CHECK_MODE")
    if raw is None or not raw.strip():
        return None
    value = raw.strip().lower()
    if value not in MODES:
        raise ConfigError(f"RUNTIME_CHECK_MODE: {raw!r} is not one of {', '.join(MODES)}")
    return value


def resolve_mode(
    cli_mode: str | None, spec_mode: str | None, environ: Mapping[str, str] | None = None
) -> str:
    """Effective mode: ``--mode`` over ``$RUNTIME_CHECK_MODE`` over the file.

    Example:
        >>> resolve_mode(None, "strict", {"RUNTIME_CHECK_MODE": "warn"}), resolve_mode("off", "strict", {})
        ('warn', 'off')
    """
    return cli_mode or env_mode(environ) or spec_mode or "strict"
