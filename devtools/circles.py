"""No circle of files: every import between two modules of ours runs one way.

import-linter's contracts keep the layers between packages; a circle inside one package (a imports
b, b imports a, often through a function-local import that dodges the import-time failure) is what
they cannot see. This reads the import graph as import-linter does (grimp: every ``import``
statement, those inside functions included) and prints each strongly connected set of modules
with the names that tie it; exit 1 when there is one. ``make check`` and the unit tests run it:

    $ python -m devtools.circles
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

import grimp

#: The packages read: the builder, the in-image runtime, and what tests and bench share.
PACKAGES = ("builder", "ml_runtime", "devtools", "bench")


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Each set of two or more modules that import one another, directly or round a loop (Tarjan's
    strongly connected components, iterative: a deep package must not hit Python's recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        members.append(member)
                        if member == node:
                            break
                    if len(members) > 1:
                        found.append(sorted(members))
    return sorted(found)


def describe(graph: grimp.ImportGraph, members: Iterable[str]) -> list[str]:
    """One line per import inside the circle: ``a -> b (line 12, 40)``."""
    inside = set(members)
    lines = []
    for a in sorted(inside):
        for b in sorted(graph.find_modules_directly_imported_by(a) & inside):
            details = graph.get_import_details(importer=a, imported=b)
            lines.append(f"  {a} -> {b} (line {', '.join(str(d['line_number']) for d in details)})")
    return lines


def main() -> int:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    found = circles(graph)
    for number, members in enumerate(found, 1):
        print(f"circle {number}: {', '.join(members)}")
        print("\n".join(describe(graph, members)))
    if found:
        print(f"{len(found)} circle(s) of files: move what both sides need to a module both import downwards")
        return 1
    print("no circle of files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
