"""Size rules, checked by ``make check`` and with the unit tests: no function in builder/, runtime/ or
bench/ of radon's grade D or worse (cyclomatic complexity above 20; ``radon cc -s -n D builder runtime
bench`` lists them), and no module over its folder's line limit.

A function that grows past grade C is split into named pieces; a module past its limit into modules by
concern (README's "Layout" and runtime/README.md's say where each kind of code goes).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from radon.complexity import add_inner_blocks, cc_rank, cc_visit
from radon.visitors import Function

from devtools.support import REPO

#: The folders whose functions are graded.
GRADED = ("builder", "runtime/ml_runtime", "bench")
#: The most lines a module of each folder may have.
MODULE_LINES = {"builder": 500, "runtime": 400, "bench": 400}


def grade_d(source: str) -> list[str]:
    """``name (line): complexity`` of each function, method or closure of grade D or worse in *source*."""
    return [f"{block.fullname} (line {block.lineno}): {block.complexity}"
            for block in add_inner_blocks(cc_visit(source))
            # a class's grade is its methods' average; they are checked one by one
            if isinstance(block, Function) and cc_rank(block.complexity) >= "D"]


def _modules(folder: str) -> list[Path]:
    return sorted((REPO / folder).rglob("*.py"))


@pytest.mark.parametrize("folder", GRADED)
def test_no_function_is_grade_d_or_worse(folder):
    found = {str(path.relative_to(REPO)): problems for path in _modules(folder)
             if (problems := grade_d(path.read_text(encoding="utf-8")))}
    assert not found, f"split these into named pieces (radon cc -s -n D {folder}): {found}"


@pytest.mark.parametrize("folder", MODULE_LINES)
def test_no_module_is_over_its_folders_limit(folder):
    limit = MODULE_LINES[folder]
    over = {str(path.relative_to(REPO)): lines for path in _modules(folder)
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > limit}
    assert not over, f"over {limit} lines: split these by concern: {over}"


def _branches(name: str, n: int, indent: str = "") -> str:
    """A function of complexity n + 1."""
    return f"{indent}def {name}(x):\n" + "".join(f"{indent}    if x == {i}:\n{indent}        return {i}\n"
                                                  for i in range(n)) + f"{indent}    return -1\n"


def test_a_planted_complex_function_is_found():
    assert grade_d(_branches("simple", 19)) == []  # 20: grade C
    assert grade_d(_branches("planted", 20)) == ["planted (line 1): 21"]
    assert grade_d("# complexity: a comment is no way out\n" + _branches("planted", 20)) == ["planted (line 2): 21"]


def test_methods_and_closures_are_checked_too():
    method = "class C:\n" + _branches("planted", 20, "    ")
    assert grade_d(method) == ["C.planted (line 2): 21"]
    closure = "def outer():\n" + _branches("inner", 20, "    ") + "    return inner\n"
    assert grade_d(closure) == ["outer.inner (line 2): 21"]
