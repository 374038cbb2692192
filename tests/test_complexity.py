"""No function in builder/ of radon's grade D or worse (cyclomatic complexity above 20) unless the line
above its ``def`` (its decorators aside) says why it must be one piece: ``# complexity: <why>``.

``radon cc -s -n D builder`` lists the same functions, marked or not.
"""

from __future__ import annotations

from radon.complexity import add_inner_blocks, cc_rank, cc_visit
from radon.visitors import Function

from devtools.support import REPO

MARKER = "# complexity:"


def unexplained(source: str) -> list[str]:
    """``name (line): complexity`` of each function, method or closure of grade D or worse in *source*
    without a marker that gives a reason."""
    lines = source.splitlines()
    found = []
    for block in add_inner_blocks(cc_visit(source)):
        if not isinstance(block, Function) or cc_rank(block.complexity) < "D":
            continue  # a class's grade is its methods' average; they are checked one by one
        above = block.lineno - 2
        while above >= 0 and lines[above].lstrip().startswith("@"):
            above -= 1
        comment = lines[above].strip() if above >= 0 else ""
        if not (comment.startswith(MARKER) and comment.removeprefix(MARKER).strip()):
            found.append(f"{block.fullname} (line {block.lineno}): {block.complexity}")
    return found


def test_no_function_in_builder_is_grade_d_or_worse_without_a_reason():
    found = {str(path.relative_to(REPO)): problems for path in sorted((REPO / "builder").rglob("*.py"))
             if (problems := unexplained(path.read_text()))}
    assert not found, (f"split these into named pieces, or say above the def why one must stay whole "
                       f"({MARKER} <why>): {found}")


def _branches(name: str, n: int, indent: str = "") -> str:
    """A function of complexity n + 1."""
    return f"{indent}def {name}(x):\n" + "".join(f"{indent}    if x == {i}:\n{indent}        return {i}\n"
                                                  for i in range(n)) + f"{indent}    return -1\n"


def test_a_planted_complex_function_is_found_and_a_reason_lets_it_pass():
    assert unexplained(_branches("simple", 19)) == []  # 20: grade C
    assert unexplained(_branches("planted", 20)) == ["planted (line 1): 21"]
    reason = "# complexity: one streaming loop, its state shared\n"
    assert unexplained(reason + _branches("planted", 20)) == []
    assert unexplained("# complexity:\n" + _branches("planted", 20)) == ["planted (line 2): 21"]  # no reason
    assert unexplained("# a comment, not the marker\n" + _branches("planted", 20)) == ["planted (line 2): 21"]
    decorated = "# complexity: why\n@staticmethod\n@other\n" + _branches("planted", 20)
    assert unexplained(decorated) == []


def test_methods_and_closures_are_checked_too():
    method = "class C:\n" + _branches("planted", 20, "    ")
    assert unexplained(method) == ["C.planted (line 2): 21"]
    closure = "def outer():\n" + _branches("inner", 20, "    ") + "    return inner\n"
    assert unexplained(closure) == ["outer.inner (line 2): 21"]
