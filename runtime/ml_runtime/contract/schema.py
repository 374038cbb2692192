"""What the two files' pydantic models share: the section base, the value types, the messages.

The runtime spec (:mod:`ml_runtime.contract.spec_file`) and the accelerator config
(:mod:`ml_runtime.policy.config_file`) are pydantic models, as the builder's ``matrix.yaml`` is;
:func:`validate` turns pydantic's first problem into one line ``FILE: KEY.PATH: problem`` raised
as :class:`~ml_runtime.errors.ConfigError` (unknown keys first: a misspelt key explains the
rest). The value types live here, so the same value gets the same message in both files. Each
validates whatever the file holds, null included (a key written without a value is a mistake);
an absent key is None. This module is imported only when a file is validated: a container start
with the image's unchanged default spec never imports pydantic (:mod:`ml_runtime.contract.record`).

Example:
    >>> class Entry(Section):
    ...     expected: ClassVar[str] = "a mapping such as 'size: 40'"
    ...     size: MemoryGB = None
    >>> validate(Entry, {"size": 40}, "a.yaml").size
    40.0
    >>> validate(Entry, {"sise": 40}, "a.yaml")
    Traceback (most recent call last):
    ...
    ml_runtime.errors.ConfigError: a.yaml: sise: unknown key (did you mean 'size'? allowed: size)
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Optional, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainValidator,
    PrivateAttr,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ml_runtime.contract.fields import did_you_mean, type_name
from ml_runtime.devices.capability import Capability, parse_capability
from ml_runtime.errors import ConfigError

ModelT = TypeVar("ModelT", bound=BaseModel)

_DOTTED = re.compile(r"^\d+(\.\d+)*$")
_UNIONS = (typing.Union, getattr(types, "UnionType", typing.Union))


def problem(message: str, at: tuple[str | int, ...] = ()) -> PydanticCustomError:
    """A validation problem; ``at`` places it below the key being validated (cross-field rules).

    Example:
        >>> problem("only supported for pytorch", ("full_distribution",)).context["at"]
        ('full_distribution',)
    """
    return PydanticCustomError("config", "{message}", {"message": message, "at": at})


class Section(BaseModel):
    """A mapping of the file: unknown keys are refused; ``expected`` names the mapping in messages.

    ``nonempty``: ``{}`` is refused as well; ``unknown``: what an unknown key is called.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    expected: ClassVar[str] = "a mapping"
    nonempty: ClassVar[bool] = False
    unknown: ClassVar[str] = "key"

    @model_validator(mode="before")
    @classmethod
    def _a_mapping(cls, data: Any) -> Any:
        if not isinstance(data, dict) or (cls.nonempty and not data):
            raise problem(f"must be {cls.expected}, not {type_name(data)}")
        return data


class Ordered(Section):
    """A section whose keys' order matters (:meth:`items` gives them as written)."""

    _keys: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _keep_order(cls, data: Any, handler: Any) -> Any:
        section = handler(data)
        section._keys = tuple(data)
        return section

    def items(self) -> list[tuple[str, Any]]:
        """(key, value), in the file's order."""
        return [(key, getattr(self, key)) for key in self._keys]


def list_of(expected: str, also: type | None = None) -> BeforeValidator:
    """A list field's shape (null passes: the key is then as good as absent; so does ``also``).

    Example:
        >>> list_of("a list of mappings").func("sm_80")
        Traceback (most recent call last):
        ...
        pydantic_core...PydanticCustomError: must be a list of mappings, not a string
    """

    def check(value: Any) -> Any:
        if value is not None and not isinstance(value, (list, also or list)):
            raise problem(f"must be {expected}, not {type_name(value)}")
        return value

    return BeforeValidator(check)


def one_of(
    allowed: tuple[str, ...], aliases: Mapping[Any, str] | None = None, note: str = ""
) -> PlainValidator:
    """A word from ``allowed`` (case and spaces ignored; ``aliases`` map other spellings onto it).

    Example:
        >>> one_of(("strict", "warn", "off"), {False: "off"}).func(False)
        'off'
    """
    names = aliases or {}

    def check(value: Any) -> str:
        word = value.strip().lower() if isinstance(value, str) else value
        word = names.get(word, word) if isinstance(word, (str, bool)) else word
        if word not in allowed:
            raise problem(f"{value!r} is not one of {', '.join(allowed)}{note}")
        return str(word)

    return PlainValidator(check)


def capability_value(value: Any) -> Capability:
    """A compute capability such as ``sm_80``, ``gfx90a`` or an Intel family or device id.

    Example:
        >>> capability_value("gfx942").text
        'gfx942'
        >>> capability_value(80)
        Traceback (most recent call last):
        ...
        pydantic_core...PydanticCustomError: must be a string such as "sm_80" or "gfx90a", not a number
    """
    if not isinstance(value, str):
        raise problem(f'must be a string such as "sm_80" or "gfx90a", not {type_name(value)}')
    try:
        return parse_capability(value)
    except ValueError as exc:
        raise problem(str(exc)) from None


def positive_number(value: Any) -> float | None:
    """``value`` as a float when it is a positive int/float (not a bool), else None.

    Example:
        >>> positive_number(40), positive_number(True), positive_number(-1)
        (40.0, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value)


def memory_gb(value: Any) -> float:
    """A positive number of GB (10**9 bytes).

    Example:
        >>> memory_gb("40")
        Traceback (most recent call last):
        ...
        pydantic_core...PydanticCustomError: must be a positive number of GB (10**9 bytes), not '40'
    """
    number = positive_number(value)
    if number is None:
        raise problem(f"must be a positive number of GB (10**9 bytes), not {value!r}")
    return number


def driver_version(value: Any) -> str:
    """A dotted driver version such as ``535.54.03`` (quoted: YAML reads 535.50 as a number).

    Example:
        >>> driver_version("535.54.03"), driver_version(550)
        ('535.54.03', '550')
    """
    if isinstance(value, float):
        raise problem(f'quote the version, e.g. "{value}" (YAML reads unquoted X.Y as a number)')
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise problem(f'must be a dotted version string such as "535.54.03", not {type_name(value)}')
    text = str(value).strip()
    if not _DOTTED.match(text):
        raise problem(f'{text!r} is not a dotted numeric version such as "535.54.03"')
    return text


def flag(value: Any) -> bool:
    """``true`` or ``false`` (YAML's booleans; not strings such as "yes").

    Example:
        >>> flag(True), flag(False)
        (True, False)
    """
    if not isinstance(value, bool):
        raise problem(f"must be true or false, not {'null' if value is None else repr(value)}")
    return value


def device_name(value: Any) -> str:
    """A device name (a non-empty string, matched as a case-insensitive substring).

    Example:
        >>> device_name(" H100 ")
        'H100'
    """
    if not isinstance(value, str) or not value.strip():
        raise problem("must be a non-empty string")
    return value.strip()


def positive_int(what: str = "") -> PlainValidator:
    """A positive integer (not a boolean); ``what`` follows "integer" in the message.

    Example:
        >>> positive_int(" of MiB").func(16384)
        16384
    """

    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise problem(f"must be a positive integer{what}, not {value!r}")
        return value

    return PlainValidator(check)


CapabilityValue = Annotated[Optional[Capability], PlainValidator(capability_value)]
MemoryGB = Annotated[Optional[float], PlainValidator(memory_gb)]
DriverVersion = Annotated[Optional[str], PlainValidator(driver_version)]
Flag = Annotated[bool, PlainValidator(flag)]
MaybeFlag = Annotated[Optional[bool], PlainValidator(flag)]
DeviceName = Annotated[Optional[str], PlainValidator(device_name)]


def validate(model: type[ModelT], data: Any, source: str) -> ModelT:
    """``data`` validated as ``model``; the first problem as one ConfigError line naming ``source``.

    Example:
        >>> class Sizes(Section):
        ...     size: MemoryGB = None
        >>> validate(Sizes, {"size": -1}, "a.yaml")
        Traceback (most recent call last):
        ...
        ml_runtime.errors.ConfigError: a.yaml: size: must be a positive number of GB (10**9 bytes), not -1
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")  # stable
        raise ConfigError(f"{source}: {error_text(model, errors[0])}") from None


def error_text(model: type[BaseModel], err: Any) -> str:
    """``KEY.PATH: problem`` for one of pydantic's errors (the key path as the user writes it).

    Example:
        >>> error_text(Section, {"loc": ("x",), "type": "extra_forbidden", "msg": "", "input": 1})
        'x: unknown key (allowed: )'
    """
    loc, kind = tuple(err["loc"]), err["type"]
    ctx = err.get("ctx") or {}
    if kind == "config":
        return _line(loc + tuple(ctx.get("at", ())), ctx["message"])
    parent = _model_at(model, loc[:-1])
    names = tuple(parent.model_fields) if parent else ()
    if kind == "extra_forbidden":
        word = parent.unknown if parent and issubclass(parent, Section) else "key"
        hint = did_you_mean(str(loc[-1]), names)
        return _line(loc, f"unknown {word} ({hint}allowed: {', '.join(names)})")
    if kind == "missing":
        field = parent.model_fields.get(str(loc[-1])) if parent else None
        hint = f" ({field.description})" if field is not None and field.description else ""
        return _line(loc[:-1], f"{loc[-1]} is missing{hint}")
    message = str(err["msg"]).removeprefix("Value error, ")
    return _line(loc, f"{message}, not {err.get('input')!r}" if kind != "value_error" else message)


def key_path(loc: tuple[Any, ...]) -> str:
    """A pydantic location as the user writes it (union tags such as ``[list]`` left out).

    Example:
        >>> key_path(("required_features", "[list]", 2, "device_memory_gb"))
        'required_features[2].device_memory_gb'
    """
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).startswith("["):
            out += ("." if out else "") + str(part)
    return out


def _line(loc: tuple[Any, ...], message: str) -> str:
    where = key_path(loc)
    return f"{where}: {message}" if where else message


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class reached by following ``loc`` from ``model`` (tags pick a union's member)."""
    tp: Any = model
    for part in loc:
        tp = _unwrap(tp, part)
        if isinstance(part, str) and part.startswith("["):
            continue
        if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(part, str):
            if part not in tp.model_fields:
                return None
            tp = tp.model_fields[part].annotation
        elif typing.get_origin(tp) in (list, dict):
            tp = typing.get_args(tp)[-1]
        else:
            return None
    tp = _unwrap(tp, None)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _unwrap(tp: Any, tag: Any) -> Any:
    """Strip Annotated/Optional down to a model or list; a union member is chosen by its Tag."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in _UNIONS:
            members = [a for a in typing.get_args(tp) if a is not type(None)]
            tagged = [a for a in members if tag in (getattr(m, "tag", None) for m in _metadata(a))]
            if len(members) != 1 and len(tagged) != 1:
                return tp
            tp = (tagged or members)[0]
        else:
            return tp


def _metadata(tp: Any) -> tuple[Any, ...]:
    return tuple(getattr(tp, "__metadata__", ()))
