"""``runtime-spec.yaml`` as pydantic models: what each key takes, and :func:`parse_spec`, which
turns a validated file into a :class:`~ml_runtime.contract.spec.Spec`.

``required_features`` is the list of single-key mappings users write, or one plain mapping;
problems are reported by :func:`~ml_runtime.contract.schema.validate`.

Example:
    >>> from ml_runtime.contract.schema import validate
    >>> validate(SpecFile, {"required_features": [{"device_memory_gb": 40}]}, "s.yaml").features()
    [('device_memory_gb', 40.0)]
"""

from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import Discriminator, Field, PlainValidator, Tag, field_validator, model_validator

from ml_runtime.contract.fields import type_name
from ml_runtime.contract.schema import (
    CapabilityValue,
    DriverVersion,
    Flag,
    MemoryGB,
    Ordered,
    Section,
    list_of,
    one_of,
    positive_number,
    problem,
    validate,
)
from ml_runtime.contract.spec import MODES, TORCH_NAMES, Dependency, DriverRequirement, Spec


def _bandwidth(value: Any) -> Union[float, str]:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    number = positive_number(value)
    if number is None:
        raise problem(f'must be a positive number of GB/s or "auto", not {value!r}')
    return number


class DriverMinimums(Section):
    """``driver_version_min`` per vendor, e.g. ``{nvidia: "535.54.03", amd: "6.8.5"}``."""

    unknown: ClassVar[str] = "vendor"
    nvidia: DriverVersion = None
    amd: DriverVersion = None
    intel: DriverVersion = None

    @model_validator(mode="after")
    def _one_vendor(self) -> "DriverMinimums":
        if not self.model_fields_set:
            raise problem("must name at least one vendor")
        return self


DriverMinimum = Annotated[
    Union[Annotated[DriverMinimums, Tag("[vendors]")], Annotated[DriverVersion, Tag("[any]")]],
    Discriminator(lambda v: "[vendors]" if isinstance(v, dict) else "[any]"),
]


class Features(Ordered):
    """One entry of ``required_features`` (usually one key), in the order written."""

    expected: ClassVar[str] = "a mapping such as 'gpu_compute_capability: \"sm_80\"'"
    nonempty: ClassVar[bool] = True
    gpu_compute_capability: CapabilityValue = None
    memory_bandwidth_gbps: Annotated[Optional[Union[float, str]], PlainValidator(_bandwidth)] = None
    driver_version_min: DriverMinimum = None  # null is a version that is missing, not an absent key
    device_memory_gb: MemoryGB = None


def _requirement(value: Any) -> DriverRequirement:
    if isinstance(value, DriverMinimums):
        return DriverRequirement({vendor: getattr(value, vendor) for vendor in value.model_fields_set})
    return DriverRequirement({None: value})


def _entry_kind(value: Any) -> str:
    return "[mapping]" if isinstance(value, dict) else "[list]"


FeatureList = Annotated[
    Union[Annotated[list[Features], Tag("[list]")], Annotated[Features, Tag("[mapping]")]],
    Discriminator(_entry_kind),
    list_of("a list of mappings", also=dict),
]


def _name(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise problem("required, a distribution name such as 'pytorch'")
    return value.strip()


def _version_range(value: Any) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str):
        raise problem(f'must be a quoted string such as ">=2.1.0,<2.2.0", not {type_name(value)}')
    try:
        SpecifierSet(value.strip())
    except InvalidSpecifier:
        raise problem(f'{value!r} is not a valid version range (PEP 440, e.g. ">=2.1.0,<2.2.0")') from None
    return value.strip()


class DependencyEntry(Section):
    """One ``dependencies`` entry."""

    expected: ClassVar[str] = "a mapping with 'name'"
    name: Annotated[str, PlainValidator(_name)] = Field(None, validate_default=True)
    version_range: Annotated[Optional[str], PlainValidator(_version_range)] = None
    full_distribution: Flag = False
    vendor_agnostic_wheel: Flag = False
    host_driver: Flag = False

    @model_validator(mode="after")
    def _torch_only(self) -> "DependencyEntry":
        for key in ("full_distribution", "vendor_agnostic_wheel", "host_driver"):
            if getattr(self, key) and self.name.lower() not in TORCH_NAMES:
                raise problem("only supported for pytorch", (key,))
        return self


class SpecFile(Section):
    """The whole ``runtime-spec.yaml``."""

    required_features: Optional[FeatureList] = None
    dependencies: Annotated[Optional[list[DependencyEntry]], list_of("a list of mappings")] = None
    mode: Annotated[Literal["strict", "warn", "off"], one_of(MODES, {False: "off"})] = "strict"

    @field_validator("required_features")
    @classmethod
    def _each_once(cls, value: Any) -> Any:
        seen: set[str] = set()
        for i, entry in enumerate(value if isinstance(value, list) else ()):
            for key in entry._keys:
                if key in seen:
                    raise problem(f"{key} is given more than once", (i, key))
                seen.add(key)
        return value

    def features(self) -> list[tuple[str, Any]]:
        """Every feature (key, value), in the file's order."""
        raw = self.required_features
        entries = raw if isinstance(raw, list) else [raw] if raw is not None else []
        return [(key, _requirement(value) if key == "driver_version_min" else value)
                for entry in entries for key, value in entry.items()]


def parse_spec(data: dict[str, Any], source: str) -> Spec:
    """Validate a loaded spec mapping into a :class:`~ml_runtime.contract.spec.Spec`.

    Example:
        >>> spec = parse_spec({"required_features": [{"device_memory_gb": 40}]}, "runtime-spec.yaml")
        >>> spec.features["device_memory_gb"], spec.mode
        (40.0, 'strict')
        >>> parse_spec({"required_features": [{"gpu_compute_capability": "sm8"}]}, "runtime-spec.yaml")
        Traceback (most recent call last):
        ...
        ml_runtime.errors.ConfigError: runtime-spec.yaml: required_features[0].gpu_compute_capability: ...
    """
    spec = validate(SpecFile, data, source)
    dependencies = tuple(
        Dependency.of(
            d.name, d.version_range, d.full_distribution, d.vendor_agnostic_wheel, f"dependencies[{i}]",
            d.host_driver,
        )
        for i, d in enumerate(spec.dependencies or ())
    )
    features = dict(spec.features())
    return Spec(source=source, features=features, dependencies=dependencies, mode=spec.mode)
