"""What the two files have in common: reading YAML, the error messages, and the values both take.

The runtime spec (:mod:`ml_runtime.contract.spec`) and the accelerator config
(:mod:`ml_runtime.policy.config`) are validated by hand (the images carry no pydantic or
jsonschema) and every problem is one line ``FILE: KEY.PATH: problem`` raised as
:class:`~ml_runtime.errors.ConfigError`. The value rules they share live here, so the same
value gets the same message in both files.

Example:
    >>> capability_value("sm_80", "a.yaml: x").text, positive_number(40)
    ('sm_80', 40.0)
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ml_runtime.devices.capability import Capability, parse_capability
from ml_runtime.errors import ConfigError

DEFAULT_WORKSPACE = "/workspace"

_DOTTED = re.compile(r"^\d+(\.\d+)*$")
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


def unknown_key(source: str, path: str, key: Any, allowed: tuple[str, ...]) -> ConfigError:
    """Error for an unknown key, with a did-you-mean hint.

    Example:
        >>> print(unknown_key("s.yaml", "dependencies[0]", "versoin_range", ("name", "version_range")))
        s.yaml: dependencies[0].versoin_range: unknown key (did you mean 'version_range'? allowed: ...)
    """
    hint = did_you_mean(str(key), allowed)
    where = f"{path}.{key}" if path else str(key)
    return ConfigError(f"{source}: {where}: unknown key ({hint}allowed: {', '.join(allowed)})")


def load_yaml_mapping(path: Path, label: str) -> dict[str, Any]:
    """Read a YAML file whose top level must be a mapping (empty file -> {}).

    Example:
        >>> load_yaml_mapping(Path("/nonexistent.yaml"), "x.yaml")
        Traceback (most recent call last):
        ...
        ml_runtime.errors.ConfigError: x.yaml: cannot read file: No such file or directory
    """
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


def capability_value(value: Any, where: str) -> Capability:
    """Validate a compute capability value; ``where`` prefixes the error.

    Example:
        >>> capability_value("gfx942", "s.yaml: x").text
        'gfx942'
        >>> capability_value(80, "s.yaml: x")
        Traceback (most recent call last):
        ...
        ml_runtime.errors.ConfigError: s.yaml: x: must be a string such as "sm_80" or "gfx90a", not a number
    """
    if not isinstance(value, str):
        raise ConfigError(f'{where}: must be a string such as "sm_80" or "gfx90a", not {type_name(value)}')
    try:
        return parse_capability(value)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def positive_number(value: Any) -> float | None:
    """``value`` as a float when it is a positive int/float (not a bool), else None.

    Example:
        >>> positive_number(40), positive_number(True), positive_number(-1)
        (40.0, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value)


def memory_gb(value: Any, where: str) -> float:
    """Validate a positive number of GB (10**9 bytes); ``where`` prefixes the error.

    Example:
        >>> memory_gb(40, "s.yaml: x")
        40.0
        >>> memory_gb("40", "s.yaml: x")
        Traceback (most recent call last):
        ...
        ml_runtime.errors.ConfigError: s.yaml: x: must be a positive number of GB (10**9 bytes), not '40'
    """
    number = positive_number(value)
    if number is None:
        raise ConfigError(f"{where}: must be a positive number of GB (10**9 bytes), not {value!r}")
    return number


def driver_version(value: Any, where: str) -> str:
    """Validate a dotted driver version; ``where`` prefixes the error.

    Example:
        >>> driver_version("535.54.03", "s.yaml: x")
        '535.54.03'
    """
    if isinstance(value, float):
        # YAML reads 535.50 as the number 535.5: the trailing zero is lost.
        raise ConfigError(f'{where}: quote the version, e.g. "{value}" (YAML reads unquoted X.Y as a number)')
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ConfigError(
            f'{where}: must be a dotted version string such as "535.54.03", not {type_name(value)}'
        )
    text = str(value).strip()
    if not _DOTTED.match(text):
        raise ConfigError(f'{where}: {text!r} is not a dotted numeric version such as "535.54.03"')
    return text


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
