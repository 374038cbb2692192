"""Safe loading of the user's YAML and JSON files.

Untrusted input must not hang the tool or eat memory: files are capped in size, YAML
aliases (the "billion laughs" expansion) and duplicate keys are refused, and deep nesting
is reported instead of crashing. Every failure is a one-line ``UserError`` naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from builder.config.errors import UserError

MAX_BYTES = 1 << 20  # 1 MiB: a matrix is a few KiB; anything larger is a mistake or an attack


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and duplicate mapping keys."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.constructor.ConstructorError(
                None, None, "YAML aliases (*name) are not allowed; write the value out", event.start_mark
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read(path: Path) -> str:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise UserError(f"{path}: file not found; pass the right path with --matrix/--wheel-mapping") from None
    if size > MAX_BYTES:
        raise UserError(f"{path}: {size} bytes is larger than the {MAX_BYTES}-byte limit for a config file")
    try:
        return path.read_text(encoding="utf-8-sig")  # a BOM (Windows editors) is not content
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def load_yaml(path: Path) -> Any:
    """Load one YAML document safely.

    Example:
        >>> load_yaml(Path("matrix.yaml"))["registry"]
        'localhost:5000/ml-runtime'
    """
    text = _read(path)
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise UserError(f"{path}{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {exc}") from None
    except RecursionError:
        raise UserError(f"{path}: nesting is too deep to be a build matrix") from None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def load_json(path: Path) -> Any:
    """Load a JSON file, refusing duplicate keys.

    Example:
        >>> load_json(Path("wheel-mapping.json"))["entries"]["cpu"]["local_version"]
        '+cpu'
    """
    text = _read(path)
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} (line {exc.lineno}, column {exc.colno}): {exc.msg}") from None
    except ValueError as exc:
        raise UserError(f"{path}: {exc}") from None
    except RecursionError:
        raise UserError(f"{path}: nesting is too deep to be a wheel mapping") from None
