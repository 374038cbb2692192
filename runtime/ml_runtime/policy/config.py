"""``accelerator-config.yaml``: locating, loading and validating it (both of its formats).

The compact ``criteria`` form and the design notes' ``device_selection_policy`` form are
described in runtime/README.md ("accelerator-config.yaml"); use one of them (together they are
an error). The keys and values are pydantic models (:mod:`ml_runtime.policy.config_file`, imported
only when a config is validated; every problem is one line ``FILE: KEY.PATH: problem``).
``rocm_config`` and ``amp_config`` become environment for the command
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

from ml_runtime.contract.fields import load_yaml_mapping, workspace_dir
from ml_runtime.errors import ConfigError
from ml_runtime.policy.priorities import PolicyEntry, policy_entries
from ml_runtime.policy.tuning import tuning_effects

CONFIG_FILENAME = "accelerator-config.yaml"

#: accelerator-config.yaml's top-level keys (:class:`~ml_runtime.policy.config_file.ConfigFile`'s fields).
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
    # Here, not at the top: pydantic (~0.2 s) is imported only when a config file is validated.
    from ml_runtime.contract.schema import validate
    from ml_runtime.policy.config_file import ConfigFile

    config = validate(ConfigFile, data, source)
    env, warnings = tuning_effects(config.rocm_config, config.amp_config)
    base = Path(source).parent if base_dir is None else Path(base_dir)
    return AcceleratorConfig(
        source=source,
        backend=config.backend,
        criteria=tuple(item for entry in config.criteria or () for item in entry.items()),
        count=config.count,
        policy=policy_entries(
            (p.priority, ((c.type, c.op, getattr(c, c.op)) for c in p.criteria))
            for p in config.device_selection_policy or ()
        ),
        runtime_contract=base / config.runtime_contract if config.runtime_contract is not None else None,
        env=env,
        warnings=tuple(warnings),
    )


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
