"""No circle of files in builder/, the runtime, devtools or bench (``python -m devtools.circles``,
also in ``make check``); and the check itself finds a circle where there is one."""

from __future__ import annotations

import subprocess
import sys

import grimp

from devtools.circles import circles, describe
from devtools.support import REPO


def test_no_module_of_ours_imports_round_a_circle():
    proc = subprocess.run([sys.executable, "-m", "devtools.circles"], cwd=REPO, capture_output=True, text=True,
                          check=False, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_circle_through_a_function_local_import_is_found_and_named():
    """a -> b -> c -> a (c's import of a inside a function) is one circle; d, imported by a alone, is not in it."""
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d"):
        graph.add_module(module)
    for importer, imported, line in (("pkg.a", "pkg.b", 3), ("pkg.b", "pkg.c", 4), ("pkg.c", "pkg.a", 40),
                                     ("pkg.a", "pkg.d", 5)):
        graph.add_import(importer=importer, imported=imported, line_number=line, line_contents=f"import {imported}")
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert "  pkg.c -> pkg.a (line 40)" in describe(graph, ["pkg.a", "pkg.b", "pkg.c"])
