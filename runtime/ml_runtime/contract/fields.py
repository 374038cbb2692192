"""What the two files have in common without pydantic: reading YAML, message words, versions.

The rules both files' values follow are pydantic types in :mod:`ml_runtime.contract.schema`;
this module is what the start-up path needs too (locating files, comparing driver versions),
so it imports neither pydantic nor, until a file is read, PyYAML.

Example:
    >>> type_name("sm_80"), version_tuple("535.54.03")
    ('a string', (535, 54, 3))
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ml_runtime.errors import ConfigError

DEFAULT_WORKSPACE = "/workspace"

_NUMBERS = re.compile(r"\d+")


def type_name(value: Any) -> str:
    """Friendly YAML type name for error messages.

    Example:
        >>> type_name([1]), type_name(True), type_name(2.5)
        ('a list', 'a boolean', 'a number')
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping" if value else "an empty mapping"
    return type(value).__name__


def did_you_mean(word: str, allowed: tuple[str, ...]) -> str:
    """``"did you mean 'X'? "`` for the closest allowed word, else ``""``.

    Example:
        >>> did_you_mean("gpu_vendr", ("gpu_vendor", "name")), did_you_mean("zzz", ("name",))
        ("did you mean 'gpu_vendor'? ", '')
    """
    close = difflib.get_close_matches(word, allowed, n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def load_yaml_mapping(path: Path, label: str) -> dict[str, Any]:
    """Read a YAML file whose top level must be a mapping (empty file -> {}).

    Example:
        >>> load_yaml_mapping(Path("/nonexistent.yaml"), "x.yaml")
        Traceback (most recent call last):
        ...
        ml_runtime.errors.ConfigError: x.yaml: cannot read file: No such file or directory
    """
    import yaml  # here, not at the top: a start with the recorded default spec reads no YAML

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read file: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{label}: not a UTF-8 text file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{label}: invalid YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{label}: the top level must be a mapping, not {type_name(data)}")
    return data


def version_tuple(text: str | None) -> tuple[int, ...]:
    """Numbers of a dotted driver version (suffixes after + or - ignored; () if none).

    Example:
        >>> version_tuple("535.54.03"), version_tuple("1.6.31294+21"), version_tuple("6.8.5-2041575")
        ((535, 54, 3), (1, 6, 31294), (6, 8, 5))
        >>> version_tuple(None)
        ()
    """
    head = re.split(r"[+\-\s]", (text or "").strip(), maxsplit=1)[0]
    return tuple(int(t) for t in _NUMBERS.findall(head))


def version_at_least(found: tuple[int, ...], minimum: tuple[int, ...]) -> bool:
    """``found >= minimum``, number by number, the shorter padded with zeros.

    Example:
        >>> version_at_least((535, 104, 5), (535, 54, 3)), version_at_least((6, 8), (6, 8, 1))
        (True, False)
    """
    width = max(len(found), len(minimum))
    return found + (0,) * (width - len(found)) >= minimum + (0,) * (width - len(minimum))


def workspace_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The workspace directory (``$RUNTIME_WORKSPACE`` or ``/workspace``).

    Example:
        >>> str(workspace_dir({"RUNTIME_WORKSPACE": "/tmp/ws"}))
        '/tmp/ws'
    """
    env = os.environ if environ is None else environ
    return Path(env.get("RUNTIME_WORKSPACE") or DEFAULT_WORKSPACE)
