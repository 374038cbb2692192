"""``rocm_config`` and ``amp_config``: what they ask for in the command's environment.

``rocm_config.use_unified_memory: true`` is ``HSA_XNACK=1`` (ROCm only);
``amp_config.dtype`` is ``ACCELERATE_MIXED_PRECISION``; keys without an effect are accepted
with one warning each (full sentences, no prefix). The sections arrive validated
(:mod:`ml_runtime.policy.config_file`). Whether a value fits the selected backend is decided at
selection (:func:`ml_runtime.policy.selection.select_devices`).

Example:
    >>> from ml_runtime.policy.config_file import AmpConfig
    >>> env, warnings = tuning_effects(None, AmpConfig(dtype="bfloat16", grad_scaler=True))
    >>> env, warnings[0][:35]
    ({'ACCELERATE_MIXED_PRECISION': 'bf16'}, 'amp_config.grad_scaler: true is ign')
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: config_file imports pydantic (~0.2 s), which a start without a config skips
    from ml_runtime.policy.config_file import AmpConfig, RocmConfig

XNACK_VARIABLE = "HSA_XNACK"

MIXED_PRECISION_VARIABLE = "ACCELERATE_MIXED_PRECISION"


def tuning_effects(
    rocm: RocmConfig | None, amp: AmpConfig | None
) -> tuple[dict[str, str], list[str]]:
    """The variables ``rocm_config`` and ``amp_config`` ask for, and their no-effect warnings.

    Example:
        >>> from ml_runtime.policy.config_file import RocmConfig
        >>> rocm = RocmConfig(use_unified_memory=True, memory_pool_size_mb=16384)
        >>> env, warnings = tuning_effects(rocm, None)
        >>> env, warnings[0][:45]
        ({'HSA_XNACK': '1'}, 'rocm_config.memory_pool_size_mb (16384) has n')
    """
    env: dict[str, str] = {}
    warnings: list[str] = []
    if rocm is not None and rocm.memory_pool_size_mb is not None:
        warnings.append(
            f"rocm_config.memory_pool_size_mb ({rocm.memory_pool_size_mb}) has no effect: ROCm has no "
            "HIP_MEMORY_POOL_SIZE setting and no hipMallocManaged pool can be pre-reserved through this "
            "file; "
            "PyTorch's HIP caching allocator is configured through PYTORCH_HIP_ALLOC_CONF "
            "(e.g. expandable_segments:True)."
        )
    if rocm is not None and rocm.use_unified_memory:
        env[XNACK_VARIABLE] = "1"
    if amp is None:
        return env, warnings
    mixed = amp.dtype
    env[MIXED_PRECISION_VARIABLE] = mixed
    if amp.backend is not None and amp.backend.lower() != "native":
        warnings.append(
            f"amp_config.backend {amp.backend!r} has no effect: Accelerate always uses "
            "PyTorch's native torch.amp."
        )
    scaler = amp.grad_scaler
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
    elif scaler is False and mixed == "fp16":
        warnings.append(
            "amp_config.grad_scaler: false has no effect: Accelerate always scales float16 "
            "gradients with a GradScaler."
        )
    return env, warnings
