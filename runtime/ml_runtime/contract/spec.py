"""The runtime contract (``runtime-spec.yaml``): locating, loading, validating.

Which file is used (the first found wins as a whole; files are not merged):

1. ``--spec PATH`` (``runtime-checker --config PATH``)
2. the path in ``$RUNTIME_SPEC``
3. ``runtime_contract`` in accelerator-config.yaml (relative to that file)
4. ``/workspace/runtime-spec.yaml`` (the directory can be moved with
   ``$RUNTIME_WORKSPACE``)
5. the packaged ``default-spec.yaml``

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
    mode: strict                          # strict | warn | off

Validation is by hand (no pydantic in images; the values both files take are in
:mod:`ml_runtime.contract.fields`) and every problem is one line ``FILE: KEY.PATH: problem``
raised as :class:`~ml_runtime.errors.ConfigError`.

Example:
    >>> spec = parse_spec({"required_features": [{"device_memory_gb": 40}]}, "runtime-spec.yaml")
    >>> spec.features["device_memory_gb"], spec.mode
    (40.0, 'strict')
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from ml_runtime.contract.fields import (
    capability_value,
    driver_version,
    load_yaml_mapping,
    memory_gb,
    positive_number,
    type_name,
    unknown_key,
    workspace_dir,
)
from ml_runtime.devices.capability import Capability
from ml_runtime.errors import ConfigError

SPEC_FILENAME = "runtime-spec.yaml"
DEFAULT_SPEC_PATH = Path(__file__).resolve().parents[1] / "default-spec.yaml"
MODES = ("strict", "warn", "off")

TOP_KEYS = ("required_features", "dependencies", "mode")
FEATURE_KEYS = ("gpu_compute_capability", "memory_bandwidth_gbps", "driver_version_min", "device_memory_gb")
DEPENDENCY_KEYS = ("name", "version_range", "full_distribution", "vendor_agnostic_wheel")
DRIVER_VENDORS = ("nvidia", "amd", "intel")
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


def parse_spec(data: dict[str, Any], source: str) -> Spec:
    """Validate a loaded spec mapping into a :class:`Spec`.

    Example:
        >>> parse_spec({"required_features": [{"gpu_compute_capability": "sm8"}]}, "runtime-spec.yaml")
        Traceback (most recent call last):
        ...
        ml_runtime.errors.ConfigError: runtime-spec.yaml: required_features[0].gpu_compute_capability: ...
    """
    for key in data:
        if key not in TOP_KEYS:
            raise unknown_key(source, "", key, TOP_KEYS)
    features = _parse_features(data.get("required_features"), source)
    dependencies = _parse_dependencies(data.get("dependencies"), source)
    mode = data.get("mode", "strict")
    if mode is False:  # YAML 1.1 reads an unquoted `off` as the boolean false
        mode = "off"
    if not isinstance(mode, str) or mode.strip().lower() not in MODES:
        raise ConfigError(f"{source}: mode: {mode!r} is not one of {', '.join(MODES)}")
    return Spec(source=source, features=features, dependencies=dependencies, mode=mode.strip().lower())


def _feature_items(raw: Any, source: str) -> list[tuple[str, str, Any]]:
    # Accept the list-of-single-key-mappings form users write, and a plain mapping.
    if raw is None:
        return []
    if isinstance(raw, dict):
        return [(f"required_features.{k}", k, v) for k, v in raw.items()]
    if not isinstance(raw, list):
        raise ConfigError(f"{source}: required_features: must be a list of mappings, not {type_name(raw)}")
    items: list[tuple[str, str, Any]] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict) or not entry:
            raise ConfigError(
                f"{source}: required_features[{i}]: must be a mapping such as "
                f"'gpu_compute_capability: \"sm_80\"', not "
                f"{type_name(entry)}"
            )
        items.extend((f"required_features[{i}].{k}", k, v) for k, v in entry.items())
    return items


def _parse_features(raw: Any, source: str) -> dict[str, Any]:
    features: dict[str, Any] = {}
    for path, key, value in _feature_items(raw, source):
        if key not in FEATURE_KEYS:
            raise unknown_key(source, path.rsplit(".", 1)[0], key, FEATURE_KEYS)
        if key in features:
            raise ConfigError(f"{source}: {path}: {key} is given more than once")
        features[key] = _FEATURE_PARSERS[key](value, f"{source}: {path}")
    return features


def _parse_bandwidth(value: Any, where: str) -> float | str:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    number = positive_number(value)
    if number is None:
        raise ConfigError(f'{where}: must be a positive number of GB/s or "auto", not {value!r}')
    return number


def _parse_driver(value: Any, where: str) -> DriverRequirement:
    if isinstance(value, dict):
        minimums: dict[str | None, str] = {}
        for vendor, version in value.items():
            if vendor not in DRIVER_VENDORS:
                raise ConfigError(f"{where}.{vendor}: unknown vendor (allowed: {', '.join(DRIVER_VENDORS)})")
            minimums[vendor] = driver_version(version, f"{where}.{vendor}")
        if not minimums:
            raise ConfigError(f"{where}: must name at least one vendor")
        return DriverRequirement(minimums)
    return DriverRequirement({None: driver_version(value, where)})


_FEATURE_PARSERS = {
    "gpu_compute_capability": capability_value,
    "memory_bandwidth_gbps": _parse_bandwidth,
    "driver_version_min": _parse_driver,
    "device_memory_gb": memory_gb,
}


def _parse_dependencies(raw: Any, source: str) -> tuple[Dependency, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"{source}: dependencies: must be a list of mappings, not {type_name(raw)}")
    deps = []
    for i, entry in enumerate(raw):
        path = f"dependencies[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{source}: {path}: must be a mapping with 'name', not {type_name(entry)}")
        for key in entry:
            if key not in DEPENDENCY_KEYS:
                raise unknown_key(source, path, key, DEPENDENCY_KEYS)
        name = entry.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{source}: {path}.name: required, a distribution name such as 'pytorch'")
        deps.append(
            Dependency(
                name=name.strip(),
                version_range=_parse_range(entry.get("version_range"), f"{source}: {path}.version_range"),
                full_distribution=_parse_torch_flag(
                    entry, "full_distribution", name.strip(), f"{source}: {path}"
                ),
                vendor_agnostic_wheel=_parse_torch_flag(
                    entry, "vendor_agnostic_wheel", name.strip(), f"{source}: {path}"
                ),
                path=path,
                range_text=str(entry["version_range"]).strip()
                if entry.get("version_range") is not None
                else None,
            )
        )
    return tuple(deps)


def _parse_range(value: Any, where: str) -> SpecifierSet | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(
            f'{where}: must be a quoted string such as ">=2.1.0,<2.2.0", not {type_name(value)}'
        )
    try:
        return SpecifierSet(value.strip())
    except InvalidSpecifier:
        raise ConfigError(
            f'{where}: {value!r} is not a valid version range (PEP 440, e.g. ">=2.1.0,<2.2.0")'
        ) from None


def _parse_torch_flag(entry: dict[str, Any], key: str, name: str, where: str) -> bool:
    value = entry.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key}: must be true or false, not {value!r}")
    if value and name.lower() not in TORCH_NAMES:
        raise ConfigError(f"{where}.{key}: only supported for pytorch")
    return value


def resolve_spec_path(
    cli_path: str | None, environ: Mapping[str, str] | None = None, contract: Path | None = None
) -> tuple[Path, str]:
    """(path, label) of the spec to use, following the documented precedence.

    ``contract`` is accelerator-config.yaml's ``runtime_contract``, already resolved.

    Example:
        >>> resolve_spec_path(None, {"RUNTIME_WORKSPACE": "/nonexistent"})[0] == DEFAULT_SPEC_PATH
        True
    """
    env = os.environ if environ is None else environ
    if cli_path:
        path = Path(cli_path)
        if not path.is_file():
            raise ConfigError(f"{cli_path}: spec file not found (from --spec)")
        return path, cli_path
    env_path = env.get("RUNTIME_SPEC")
    if env_path:
        if not Path(env_path).is_file():
            raise ConfigError(f"{env_path}: spec file not found (from RUNTIME_SPEC)")
        return Path(env_path), env_path
    if contract is not None:
        if not contract.is_file():
            raise ConfigError(
                f"{contract}: spec file not found (from runtime_contract in accelerator-config.yaml)"
            )
        return contract, str(contract)
    candidate = workspace_dir(env) / SPEC_FILENAME
    if candidate.is_file():
        return candidate, str(candidate)
    return DEFAULT_SPEC_PATH, str(DEFAULT_SPEC_PATH)


def load_spec(
    cli_path: str | None = None, environ: Mapping[str, str] | None = None, contract: Path | None = None
) -> Spec:
    """Locate, read and validate the spec.

    Example:
        >>> load_spec(environ={"RUNTIME_WORKSPACE": "/nonexistent"}).dependencies[0].name
        'pytorch'
    """
    path, label = resolve_spec_path(cli_path, environ, contract)
    return parse_spec(load_yaml_mapping(path, label), label)


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
