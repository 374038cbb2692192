"""Helpers only the tests use (import as `from helpers import ...`).

What the tests share with the benchmark (project copies, ports, matrix edits, registries, the
rule for a missing prerequisite) lives in ``devtools/support.py``: import it from there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from devtools.support import base_pin, host_platform, retarget_base_lock


def run_builder(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: int = 1800):
    """Run the real CLI in a subprocess (exit codes and stderr exactly as a user sees them)."""
    return subprocess.run(
        [sys.executable, "-m", "builder", *args], cwd=cwd, capture_output=True, text=True,
        env={**os.environ, **(env or {})}, timeout=timeout, check=False,
    )


def publish_base_to(engine: Any, src: Path, dest: Path, registry: str) -> dict[str, Any]:
    """Pin src's base in dest as ``<registry>/base@...`` and push it there (same layers: same digest)."""
    source = base_pin(src)["reference"]  # the engine's own ID for it differs by image store
    lock = retarget_base_lock(src, dest, registry)
    engine.api.tag(source, registry + "/base", "bookworm")
    engine.api.push(registry + "/base", "bookworm")
    return lock


def bare_build_project(monkeypatch: Any, folder: Path) -> SimpleNamespace:
    """Stub what ``build_all`` does before building (base, locks, render, content; wheelhouse: *folder*).

    Returns the least project ``build_all`` needs: its root (*folder*). Each view's content tag is
    ``127.0.0.1:1/fake:<unit>-0`` (no registry answers there: nothing is reused from one), and
    its build context ``wheels`` an empty folder of *folder*.
    """
    from builder.images import build, content, layers, render, wheelhouse

    monkeypatch.setattr(build, "ensure_base_present", lambda client, project, platform, *a, **k: "base@sha256:0")
    monkeypatch.setattr(build.locks, "lock_all", lambda *a, **k: {})
    monkeypatch.setattr(content, "content_tags",
                        lambda project, targets, *a: {t.unit: f"127.0.0.1:1/fake:{t.unit}-0" for t in targets})
    monkeypatch.setattr(content, "build_args", lambda project, target: {})  # no locks: no layer arguments
    monkeypatch.setattr(layers, "context_layers", lambda project, target: {})  # nor wheels
    monkeypatch.setattr(wheelhouse, "location", lambda: folder)
    monkeypatch.setattr(render, "render", lambda *a: {})
    monkeypatch.setattr(render, "write", lambda *a: None)
    return SimpleNamespace(root=folder, matrix=SimpleNamespace(),
                           base_refs={host_platform(): "base@sha256:0"}, base_for=lambda platform: "base@sha256:0")


def fake_target(name: str, platform: str | None = None, **fields: Any) -> SimpleNamespace:
    """The least target view ``build_all`` needs for a test Dockerfile: one platform (default: this
    host's), tagged ``primary_ref`` (default: ``127.0.0.1:1/fake:<name>``, where no registry answers)."""
    platform = platform or host_platform()
    primary = fields.pop("primary_ref", f"127.0.0.1:1/fake:{name}")
    return SimpleNamespace(name=name, unit=name, platform=platform, platforms=[platform], local_refs=[primary],
                           primary_ref=primary, refs=[primary], platform_refs=[], alias_refs=[], labels={},
                           arch=platform.split("/")[1], native=platform == host_platform(), compression="gzip",
                           **fields)


def assert_golden(path: Path, text: str) -> None:
    """*text* equals the golden file at *path*; with UPDATE_GOLDEN=1 it is rewritten and the test skipped.

    Comparing with what was just written would pass whatever the output: compare on the next run.
    """
    import pytest

    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        pytest.skip(f"golden file {path.name} updated; review the diff and rerun without UPDATE_GOLDEN")
    assert text == path.read_text()
