"""Rules of the engine layer that ``make check`` (the unit tests) holds, without an engine:

- nothing under builder/ writes the process environment: a choice (``--engine``, ``--builder``) travels as an
  argument to where it is used, and a child process gets its environment as an argument
  (:func:`builder.oci.secrets.child_env`);
- the :class:`~builder.oci.engine.Engine` Protocol answers in its own types, never in one engine's
  raw ``dict``.

The third, that only :mod:`builder.oci.docker` imports docker-py (and :mod:`builder.oci.dockerconfig`, for
``docker login``'s credentials), is an import-linter contract (pyproject.toml, run by tests/test_architecture.py).
"""

from __future__ import annotations

import ast
import typing
from typing import Any

import pytest

from builder.oci.engine import Engine
from devtools.support import REPO

#: The calls that change the process environment: os.putenv/unsetenv, and os.environ's mutating methods.
_OS_WRITES = {"putenv", "unsetenv"}
_ENVIRON_WRITES = {"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"}


def _is_environ(node: ast.expr) -> bool:
    """``os.environ`` (or ``environ`` imported from os)."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name)
            and node.value.id == "os") or (isinstance(node, ast.Name) and node.id == "environ")


def environment_writes(source: str) -> list[int]:
    """The lines of *source* that write the process environment.

    Example:
        >>> environment_writes("import os\\nos.environ['A'] = '1'\\nos.environ.get('B')\\n")
        [2]
    """
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign | ast.Delete | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            if any(isinstance(t, ast.Subscript) and _is_environ(t.value) for t in targets):
                lines.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            if (func.attr in _ENVIRON_WRITES and _is_environ(func.value)) or (
                    func.attr in _OS_WRITES and isinstance(func.value, ast.Name) and func.value.id == "os"):
                lines.append(node.lineno)
    return sorted(lines)


@pytest.mark.parametrize("source", [
    "import os\nos.environ['BUILDX_BUILDER'] = 'b'\n",
    "import os\nos.environ.update(BUILDER_ENGINE='podman')\n",
    "import os\nos.environ.setdefault('A', '1')\n",
    "import os\nos.putenv('A', '1')\n",
    "import os\ndel os.environ['A']\n",
    "from os import environ\nenviron['A'] = '1'\n",
])
def test_the_environment_check_finds_each_form_of_write(source: str) -> None:
    assert environment_writes(source) == [2]


def test_reading_the_environment_is_no_write() -> None:
    assert environment_writes("import os\nx = os.environ.get('A')\ny = dict(os.environ)\nz = os.environ['B']\n") == []


def test_nothing_in_builder_writes_the_process_environment() -> None:
    """The CLI wrote BUILDER_ENGINE and BUILDX_BUILDER for modules below to read back: hidden channels."""
    found = [f"{path.relative_to(REPO)}:{line}" for path in sorted((REPO / "builder").rglob("*.py"))
             for line in environment_writes(path.read_text())]
    assert not found, f"these write the process environment; pass the value as an argument: {found}"


def _raw(annotation: Any) -> bool:
    """Whether a return annotation is, or holds, one engine's raw answer: ``Any``, or a bare ``dict``.

    Example:
        >>> _raw(dict[str, Any]), _raw(list[dict[str, Any]]), _raw(dict), _raw(dict[str, str]), _raw(str | None)
        (True, True, True, False, False)
    """
    if annotation is Any or annotation is dict:
        return True
    return any(_raw(arg) for arg in typing.get_args(annotation))


@pytest.mark.parametrize("annotation", [Any, dict, dict[str, Any], dict[str, Any] | None, list[dict[str, Any]],
                                        tuple[int, Any]])
def test_the_raw_answer_check_finds_each_form(annotation: Any) -> None:
    assert _raw(annotation)


def test_no_engine_method_returns_a_raw_answer() -> None:
    """``image()``, ``info()``, ``version()``, ``disk_usage()`` returned Docker's ``dict[str, Any]``: podman rebuilt
    Docker's ``df`` and gc and doctor indexed Docker's keys. Each answer is a type of :mod:`builder.oci.engine`."""
    methods = [name for name, value in vars(Engine).items() if callable(value) and not name.startswith("_")]
    assert "image" in methods and "disk_usage" in methods
    raw = {name: hints["return"] for name in methods
           if _raw((hints := typing.get_type_hints(getattr(Engine, name))).get("return"))}
    assert not raw, f"these Engine methods answer in a raw dict or Any; give them a type: {raw}"
