"""``rocm_config`` and ``amp_config``: what they ask for in the command's environment.

``rocm_config.use_unified_memory: true`` is ``HSA_XNACK=1`` (ROCm only);
``amp_config.dtype`` is ``ACCELERATE_MIXED_PRECISION``; keys without an effect are accepted
with one warning each (full sentences, no prefix). Whether a value fits the selected backend is
decided at selection (:func:`ml_runtime.policy.selection.select_devices`).

Example:
    >>> env, warnings = {}, []
    >>> parse_amp({"dtype": "bfloat16", "grad_scaler": True}, "a.yaml", env, warnings)
    >>> env, warnings[0][:35]
    ({'ACCELERATE_MIXED_PRECISION': 'bf16'}, 'amp_config.grad_scaler: true is ign')
"""

from __future__ import annotations

from typing import Any

from ml_runtime.contract.fields import type_name, unknown_key
from ml_runtime.errors import ConfigError

ROCM_KEYS = ("memory_pool_size_mb", "use_unified_memory")

AMP_KEYS = ("backend", "dtype", "grad_scaler")

AMP_DTYPES = {
    "float16": "fp16",
    "fp16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float32": "no",
    "fp32": "no",
    "no": "no",
}

XNACK_VARIABLE = "HSA_XNACK"

MIXED_PRECISION_VARIABLE = "ACCELERATE_MIXED_PRECISION"


def _section(raw: Any, source: str, key: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: {key}: must be a mapping of {', '.join(allowed)}, not {type_name(raw)}")
    for name in raw:
        if name not in allowed:
            raise unknown_key(source, key, name, allowed)
    return raw


def _flag(section: dict[str, Any], key: str, source: str, where: str) -> bool:
    value = section[key]
    if not isinstance(value, bool):
        raise ConfigError(f"{source}: {where}.{key}: must be true or false, not {type_name(value)}")
    return value


def parse_rocm(raw: Any, source: str, env: dict[str, str], warnings: list[str]) -> None:
    """Validate ``rocm_config``; add its variables to ``env`` and its no-effect notes to ``warnings``.

    Example:
        >>> env, warnings = {}, []
        >>> parse_rocm({"use_unified_memory": True, "memory_pool_size_mb": 16384}, "a.yaml", env, warnings)
        >>> env, warnings[0][:45]
        ({'HSA_XNACK': '1'}, 'rocm_config.memory_pool_size_mb (16384) has n')
    """
    section = _section(raw, source, "rocm_config", ROCM_KEYS)
    if "memory_pool_size_mb" in section:
        size = section["memory_pool_size_mb"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(
                f"{source}: rocm_config.memory_pool_size_mb: must be a positive integer of MiB, not {size!r}"
            )
        warnings.append(
            f"rocm_config.memory_pool_size_mb ({size}) has no effect: ROCm has no HIP_MEMORY_POOL_SIZE "
            "setting and no hipMallocManaged pool can be pre-reserved through this file; "
            "PyTorch's HIP caching allocator is configured through PYTORCH_HIP_ALLOC_CONF "
            "(e.g. expandable_segments:True)."
        )
    if "use_unified_memory" in section and _flag(section, "use_unified_memory", source, "rocm_config"):
        env[XNACK_VARIABLE] = "1"


def parse_amp(raw: Any, source: str, env: dict[str, str], warnings: list[str]) -> None:
    """Validate ``amp_config``; add ``ACCELERATE_MIXED_PRECISION`` to ``env``, notes to ``warnings``.

    Example:
        >>> parse_amp({"dtype": "int8"}, "a.yaml", {}, [])
        Traceback (most recent call last):
        ...
        ml_runtime.errors.ConfigError: a.yaml: amp_config.dtype: 'int8' is not one of float16 ...
    """
    if raw is None:
        return
    section = _section(raw, source, "amp_config", AMP_KEYS)
    if "dtype" not in section:
        raise ConfigError(f"{source}: amp_config: dtype is missing (float16, bfloat16 or float32)")
    dtype = section["dtype"]
    if dtype is False:  # YAML 1.1 reads an unquoted `no` as the boolean false
        dtype = "no"
    mixed = AMP_DTYPES.get(dtype.strip().lower()) if isinstance(dtype, str) else None
    if mixed is None:
        raise ConfigError(
            f"{source}: amp_config.dtype: {dtype!r} is not one of float16 (fp16, half), "
            "bfloat16 (bf16), float32 (fp32, no)"
        )
    env[MIXED_PRECISION_VARIABLE] = mixed
    if "backend" in section:
        backend = section["backend"]
        if not isinstance(backend, str) or not backend.strip():
            raise ConfigError(f'{source}: amp_config.backend: must be a non-empty string such as "native"')
        if backend.strip().lower() != "native":
            warnings.append(
                f"amp_config.backend {backend.strip()!r} has no effect: Accelerate always uses "
                "PyTorch's native torch.amp."
            )
    if "grad_scaler" in section:
        scaler = _flag(section, "grad_scaler", source, "amp_config")
        if scaler and mixed == "bf16":
            warnings.append(
                "amp_config.grad_scaler: true is ignored with bfloat16: bf16 needs no loss scaling "
                "and Accelerate uses no GradScaler for it."
            )
        elif scaler and mixed == "no":
            warnings.append(
                "amp_config.grad_scaler: true has no effect with float32: there is no mixed precision "
                "and Accelerate uses no GradScaler."
            )
        elif not scaler and mixed == "fp16":
            warnings.append(
                "amp_config.grad_scaler: false has no effect: Accelerate always scales float16 "
                "gradients with a GradScaler."
            )
