"""Every docstring example in ml_runtime runs and holds."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import ml_runtime
import pytest

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(ml_runtime.__path__, "ml_runtime.")
    if m.name != "ml_runtime.__main__"
)


@pytest.mark.parametrize("name", ["ml_runtime", *MODULES])
def test_docstring_examples(name, workspace):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_every_public_function_has_a_docstring_with_an_example():
    missing = []
    for name in MODULES:
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if attr.startswith("_") or getattr(value, "__module__", None) != name or not callable(value):
                continue
            doc = value.__doc__ or ""
            if "Example" not in doc and not isinstance(value, type):
                missing.append(f"{name}.{attr}")
    assert missing == []
