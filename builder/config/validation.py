"""Turn pydantic's errors into one line per problem: ``file: key.path: what is wrong and allowed``."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError


def key_path(loc: tuple[Any, ...]) -> str:
    """Render a pydantic location as the user writes it.

    Example:
        >>> key_path(("targets", 2, "torch"))
        'targets[2].torch'
    """
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":
            out += " (key)"
        else:
            out += ("." if out else "") + str(part)
    return out


def _unwrap(tp: Any) -> Any:
    """Strip Annotated/Optional wrappers down to the model, list or dict type."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class reached by following *loc* from *model*, if any."""
    tp: Any = model
    for part in loc:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(part, str):
            fields = {f.alias or name: f for name, f in tp.model_fields.items()}
            if part not in fields:
                return None
            tp = fields[part].annotation
        elif typing.get_origin(tp) in (list, dict):
            tp = typing.get_args(tp)[-1]
        else:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def format_errors(path: Path, model: type[BaseModel], exc: ValidationError) -> list[str]:
    """One line per pydantic error, naming the file, the key path, the bad value and what is allowed."""
    lines = []
    for err in exc.errors():
        loc, kind, msg, value = err["loc"], err["type"], err["msg"], err.get("input")
        where = key_path(loc)
        if kind == "extra_forbidden":
            parent = _model_at(model, loc[:-1])
            allowed = ", ".join(f.alias or n for n, f in parent.model_fields.items()) if parent else "?"
            msg = f"unknown key (allowed here: {allowed})"
        elif kind == "missing":
            parent = _model_at(model, loc[:-1])
            field = parent.model_fields.get(str(loc[-1])) if parent else None
            hint = f" ({field.description})" if field is not None and field.description else ""
            msg = f"required key is missing{hint}"
        elif kind == "value_error":
            msg = msg.removeprefix("Value error, ")
        elif kind in ("string_type", "int_type", "bool_type") and isinstance(value, (int, float, bool)):
            msg = f"{msg}, got {_short(value)}" + (
                f"; write it in quotes: '{value}'" if kind == "string_type" else ""
            )
        else:
            msg = f"{msg}, got {_short(value)}"
        for line in msg.split("\n"):
            lines.append(f"{path.name}: {where + ': ' if where else ''}{line}")
    return lines
