"""``accelerator-config.yaml`` as pydantic models, both of its forms
(:mod:`ml_runtime.policy.config` turns the result into an
:class:`~ml_runtime.policy.config.AcceleratorConfig`).

Example:
    >>> from ml_runtime.contract.schema import validate
    >>> config = validate(ConfigFile, {"backend": "oneapi", "count": "all"}, "a.yaml")
    >>> config.backend, config.count
    ('xpu', None)
"""

from typing import Annotated, Any, ClassVar, Literal, Optional

from pydantic import Field, PlainValidator, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ml_runtime.contract.fields import did_you_mean, type_name
from ml_runtime.contract.schema import (
    CapabilityValue,
    DeviceName,
    MaybeFlag,
    MemoryGB,
    Ordered,
    Section,
    capability_value,
    device_name,
    driver_version,
    list_of,
    memory_gb,
    one_of,
    positive_int,
    problem,
)
from ml_runtime.policy.priorities import POLICY_TYPES, VENDOR_ALIASES, VENDORS

BACKENDS = ("auto", "cuda", "rocm", "xpu", "cpu")
BACKEND_ALIASES = {"oneapi": "xpu"}

#: ``amp_config.dtype``'s spellings, and the ACCELERATE_MIXED_PRECISION value each one means.
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

Vendor = Annotated[Optional[str], one_of(VENDORS)]


class Criteria(Ordered):
    """One entry of the compact ``criteria`` list (devices must satisfy every key), in the order written."""

    expected: ClassVar[str] = "a mapping such as 'vendor: nvidia'"
    nonempty: ClassVar[bool] = True
    min_compute_capability: CapabilityValue = None
    vendor: Vendor = None
    min_memory_gb: MemoryGB = None
    name: DeviceName = None


def _criterion_type(value: Any) -> str:
    kind = value.strip().lower() if isinstance(value, str) else None
    if kind not in POLICY_TYPES:
        hint = did_you_mean(str(value).strip().lower(), tuple(POLICY_TYPES))
        raise problem(f"{value!r} is not a criterion type ({hint}allowed: {', '.join(POLICY_TYPES)})")
    return str(kind)


def _vendor_alias(value: Any) -> str:
    text = value.strip().lower() if isinstance(value, str) else None
    text = VENDOR_ALIASES.get(text, text) if text else text
    if text not in VENDORS:
        raise problem(f"{value!r} is not one of {', '.join(VENDORS)} (or {', '.join(VENDOR_ALIASES)})")
    return text


#: How the value of each criterion type is validated.
_VALUES = {
    "gpu_compute_capability": capability_value,
    "driver_version": driver_version,
    "gpu_vendor": _vendor_alias,
    "memory_gb": memory_gb,
    "device_memory_gb": memory_gb,
    "name": device_name,
}


class PolicyCriterionEntry(Section):
    """``{type: T, min: X}`` or ``{type: T, equals: X}``; the value's rule follows the type."""

    expected: ClassVar[str] = "a mapping such as {type: gpu_vendor, equals: nvidia}"
    nonempty: ClassVar[bool] = True
    type: Annotated[str, PlainValidator(_criterion_type)] = Field(
        description=f"allowed: {', '.join(POLICY_TYPES)}"
    )
    min: Any = None
    equals: Any = None

    @model_validator(mode="after")
    def _one_comparison(self) -> "PolicyCriterionEntry":
        ops = POLICY_TYPES[self.type]
        takes = " or ".join(ops)
        given = [op for op in ("min", "equals") if op in self.model_fields_set]
        if not given:
            raise problem(f"{self.type} needs {takes}")
        if len(given) == 2:
            raise problem("give either min or equals, not both")
        op = given[0]
        if op not in ops:
            raise problem(f"{self.type} takes {takes}, not {op}", (op,))
        try:
            object.__setattr__(self, op, _VALUES[self.type](getattr(self, op)))
        except PydanticCustomError as exc:
            raise problem(exc.message(), (op,)) from None
        return self

    @property
    def op(self) -> str:
        """``min`` or ``equals``."""
        return "min" if "min" in self.model_fields_set else "equals"


class PolicyPriority(Section):
    """One priority of ``device_selection_policy``: criteria a device must satisfy (``[]``: any)."""

    expected: ClassVar[str] = "a mapping with priority and criteria"
    nonempty: ClassVar[bool] = True
    priority: Annotated[int, positive_int()] = Field(description="a positive integer; 1 is tried first")
    criteria: Annotated[list[PolicyCriterionEntry], list_of("a list of mappings")] = Field(
        description="a list such as [{type: gpu_vendor, equals: nvidia}]; [] accepts any device"
    )

    @model_validator(mode="before")
    @classmethod
    def _null_criteria_is_missing(cls, data: Any) -> Any:
        if isinstance(data, dict) and "criteria" in data and data["criteria"] is None:
            return {k: v for k, v in data.items() if k != "criteria"}
        return data


def _count(value: Any) -> Optional[int]:
    if value is None or (isinstance(value, str) and value.strip().lower() == "all"):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise problem(f'must be a positive integer or "all", not {value!r}')
    return value


def _contract_path(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        what = type_name(value) if value != "" else "an empty string"
        raise problem(f'must be a non-empty path string such as "./runtime-spec.yaml", not {what}')
    return value.strip()


class RocmConfig(Section):
    """``rocm_config``: ``use_unified_memory`` is HSA_XNACK=1; the pool size has no effect."""

    expected: ClassVar[str] = "a mapping of memory_pool_size_mb, use_unified_memory"
    memory_pool_size_mb: Annotated[Optional[int], positive_int(" of MiB")] = None
    use_unified_memory: MaybeFlag = None


def _amp_backend(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise problem('must be a non-empty string such as "native"')
    return value.strip()


def _dtype(value: Any) -> str:
    if value is False:  # YAML 1.1 reads an unquoted `no` as the boolean false
        value = "no"
    mixed = AMP_DTYPES.get(value.strip().lower()) if isinstance(value, str) else None
    if mixed is None:
        raise problem(
            f"{value!r} is not one of float16 (fp16, half), bfloat16 (bf16), float32 (fp32, no)"
        )
    return mixed


class AmpConfig(Section):
    """``amp_config``: ``dtype`` is ACCELERATE_MIXED_PRECISION (fp16, bf16 or no)."""

    expected: ClassVar[str] = "a mapping of backend, dtype, grad_scaler"
    backend: Annotated[Optional[str], PlainValidator(_amp_backend)] = None
    dtype: Annotated[Literal["fp16", "bf16", "no"], PlainValidator(_dtype)] = Field(
        description="float16, bfloat16 or float32"
    )
    grad_scaler: MaybeFlag = None


class ConfigFile(Section):
    """The whole ``accelerator-config.yaml``."""

    backend: Annotated[
        Literal["auto", "cuda", "rocm", "xpu", "cpu"],
        one_of(BACKENDS, BACKEND_ALIASES, " (or oneapi for xpu)"),
    ] = "auto"
    criteria: Annotated[Optional[list[Criteria]], list_of("a list of mappings")] = None
    count: Annotated[Optional[int], PlainValidator(_count)] = None
    device_selection_policy: Annotated[
        Optional[list[PolicyPriority]],
        list_of("a list of priorities such as '- priority: 1' with criteria"),
    ] = None
    runtime_contract: Annotated[Optional[str], PlainValidator(_contract_path)] = None
    rocm_config: Optional[RocmConfig] = None
    amp_config: Optional[AmpConfig] = None

    @field_validator("device_selection_policy")
    @classmethod
    def _distinct_priorities(cls, value: Optional[list[PolicyPriority]]) -> Optional[list[PolicyPriority]]:
        if value is None:
            return None
        if not value:
            raise problem("is empty; list at least one priority or remove the key")
        seen: dict[int, int] = {}
        for i, entry in enumerate(value):
            if entry.priority in seen:
                raise problem(
                    f"{entry.priority} is already used by device_selection_policy[{seen[entry.priority]}]; "
                    "each priority must be distinct", (i, "priority"),
                )
            seen[entry.priority] = i
        return value

    @model_validator(mode="after")
    def _one_form(self) -> "ConfigFile":
        if {"criteria", "device_selection_policy"} <= self.model_fields_set:
            raise problem(
                "criteria and device_selection_policy cannot be combined; use one "
                "(criteria: one list that devices must satisfy; "
                "device_selection_policy: priorities tried in order)"
            )
        return self

