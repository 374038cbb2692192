"""``accelerator-config.yaml``: locating, loading and validating it (both of its formats).

The compact ``criteria`` form and the design notes' ``device_selection_policy`` form are
described in runtime/README.md ("accelerator-config.yaml"); use one of them (together they are
an error; the priorities are parsed in :mod:`ml_runtime.policy.priorities`). ``rocm_config`` and
``amp_config`` become environment for the command
(:mod:`ml_runtime.policy.tuning`). Config file: ``--config``, else ``$ACCELERATOR_CONFIG``,
else ``/workspace/accelerator-config.yaml`` when present.

Example:
    >>> cfg = parse_accelerator_config({"criteria": [{"min_compute_capability": "sm_80"}]}, "a.yaml")
    >>> cfg.criteria[0][1].text, cfg.count
    ('sm_80', None)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ml_runtime.contract.fields import (
    capability_value,
    load_yaml_mapping,
    memory_gb,
    type_name,
    unknown_key,
    workspace_dir,
)
from ml_runtime.errors import ConfigError
from ml_runtime.policy.priorities import VENDORS, PolicyEntry, name_value, parse_policy
from ml_runtime.policy.tuning import parse_amp, parse_rocm

CONFIG_FILENAME = "accelerator-config.yaml"

BACKENDS = ("auto", "cuda", "rocm", "xpu", "cpu")

BACKEND_ALIASES = {"oneapi": "xpu"}

CRITERIA_KEYS = ("min_compute_capability", "vendor", "min_memory_gb", "name")

CONFIG_KEYS = (
    "backend",
    "criteria",
    "count",
    "device_selection_policy",
    "runtime_contract",
    "rocm_config",
    "amp_config",
)


SPEC_KEYS = ("required_features", "dependencies")


@dataclass(frozen=True)
class AcceleratorConfig:
    """A validated accelerator-config.yaml.

    ``policy`` is sorted by priority; ``env`` is what ``rocm_config`` and
    ``amp_config`` ask for in the command's environment (applied by
    :func:`select_devices` where it fits the selected backend); ``warnings``
    name accepted keys that have no effect (full sentences, no prefix).

    Example:
        >>> AcceleratorConfig(source="a.yaml").backend
        'auto'
    """

    source: str
    backend: str = "auto"
    criteria: tuple[tuple[str, Any], ...] = ()
    count: int | None = None
    policy: tuple[PolicyEntry, ...] = ()
    runtime_contract: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


def looks_like_spec(data: Any) -> bool:
    """True for a loaded mapping that is a runtime spec, not an accelerator config.

    Example:
        >>> looks_like_spec({"required_features": [{"device_memory_gb": 40}], "mode": "warn"})
        True
        >>> looks_like_spec({"backend": "auto", "dependencies": []}), looks_like_spec({})
        (False, False)
    """
    if not isinstance(data, dict):
        return False
    return any(k in data for k in SPEC_KEYS) and not any(k in data for k in CONFIG_KEYS)


def parse_accelerator_config(
    data: dict[str, Any], source: str, base_dir: Path | None = None
) -> AcceleratorConfig:
    """Validate a loaded accelerator-config mapping.

    ``base_dir`` resolves ``runtime_contract`` (default: the directory of
    ``source``); whether that file exists is for the caller to report.

    Example:
        >>> parse_accelerator_config({"count": 0}, "a.yaml")
        Traceback (most recent call last):
        ...
        ml_runtime.errors.ConfigError: a.yaml: count: must be a positive integer or "all", not 0
        >>> data = {"backend": "oneapi", "runtime_contract": "./s.yaml"}
        >>> cfg = parse_accelerator_config(data, "cfg/a.yaml")
        >>> cfg.backend, str(cfg.runtime_contract)
        ('xpu', 'cfg/s.yaml')
    """
    for key in data:
        if key not in CONFIG_KEYS:
            raise unknown_key(source, "", key, CONFIG_KEYS)
    backend = data.get("backend", "auto")
    name = backend.strip().lower() if isinstance(backend, str) else None
    name = BACKEND_ALIASES.get(name, name) if name else name
    if name not in BACKENDS:
        raise ConfigError(
            f"{source}: backend: {backend!r} is not one of {', '.join(BACKENDS)} (or oneapi for xpu)"
        )
    count = data.get("count")
    if isinstance(count, str) and count.strip().lower() == "all":
        count = None
    elif count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ConfigError(f'{source}: count: must be a positive integer or "all", not {count!r}')
    if "criteria" in data and "device_selection_policy" in data:
        raise ConfigError(
            f"{source}: criteria and device_selection_policy cannot be combined; use one "
            "(criteria: one list that devices must satisfy; "
            "device_selection_policy: priorities tried in order)"
        )
    warnings: list[str] = []
    env: dict[str, str] = {}
    parse_rocm(data.get("rocm_config"), source, env, warnings)
    parse_amp(data.get("amp_config"), source, env, warnings)
    base = Path(source).parent if base_dir is None else Path(base_dir)
    return AcceleratorConfig(
        source=source,
        backend=name,
        criteria=_parse_criteria(data.get("criteria"), source),
        count=count,
        policy=parse_policy(data.get("device_selection_policy"), source),
        runtime_contract=_parse_contract(data, source, base),
        env=env,
        warnings=tuple(warnings),
    )


def _parse_criteria(raw: Any, source: str) -> tuple[tuple[str, Any], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"{source}: criteria: must be a list of mappings, not {type_name(raw)}")
    criteria: list[tuple[str, Any]] = []
    for i, entry in enumerate(raw):
        path = f"criteria[{i}]"
        if not isinstance(entry, dict) or not entry:
            raise ConfigError(
                f"{source}: {path}: must be a mapping such as 'vendor: nvidia', not {type_name(entry)}"
            )
        for key, value in entry.items():
            where = f"{source}: {path}.{key}"
            if key == "min_compute_capability":
                criteria.append((key, capability_value(value, where)))
            elif key == "vendor":
                if not isinstance(value, str) or value.strip().lower() not in VENDORS:
                    raise ConfigError(f"{where}: {value!r} is not one of {', '.join(VENDORS)}")
                criteria.append((key, value.strip().lower()))
            elif key == "min_memory_gb":
                criteria.append((key, memory_gb(value, where)))
            elif key == "name":
                criteria.append((key, name_value(value, where)))
            else:
                raise unknown_key(source, path, key, CRITERIA_KEYS)
    return tuple(criteria)


def _parse_contract(data: dict[str, Any], source: str, base: Path) -> Path | None:
    if "runtime_contract" not in data:
        return None
    value = data["runtime_contract"]
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            f'{source}: runtime_contract: must be a non-empty path string such as "./runtime-spec.yaml", '
            f"not {type_name(value) if value != '' else 'an empty string'}"
        )
    return base / value.strip()


def resolve_config_path(
    cli_path: str | Path | None, environ: Mapping[str, str] | None = None
) -> tuple[Path, str] | None:
    """(path, label) of the accelerator config, or None when there is none.

    Example:
        >>> resolve_config_path(None, {"RUNTIME_WORKSPACE": "/nonexistent"}) is None
        True
    """
    env = os.environ if environ is None else environ
    if cli_path:
        if not Path(cli_path).is_file():
            raise ConfigError(f"{cli_path}: accelerator config not found (from --config)")
        return Path(cli_path), str(cli_path)
    env_path = env.get("ACCELERATOR_CONFIG")
    if env_path:
        if not Path(env_path).is_file():
            raise ConfigError(f"{env_path}: accelerator config not found (from ACCELERATOR_CONFIG)")
        return Path(env_path), env_path
    candidate = workspace_dir(env) / CONFIG_FILENAME
    return (candidate, str(candidate)) if candidate.is_file() else None


def load_accelerator_config(
    cli_path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> AcceleratorConfig | None:
    """Locate and validate the accelerator config (None when absent).

    Example:
        >>> load_accelerator_config(None, {"RUNTIME_WORKSPACE": "/nonexistent"}) is None
        True
    """
    found = resolve_config_path(cli_path, environ)
    if found is None:
        return None
    path, label = found
    return parse_accelerator_config(load_yaml_mapping(path, label), label, path.parent)
