"""The docstring examples of builder, bench and devtools run and hold (ml_runtime's: tests/runtime).

They run in a private copy of the project (some write files: a Dockerfile, a lock, an sbatch
script), with ``project`` (that copy, loaded) and a few of its targets already defined, as the
examples assume; their temporary folders go below it. Examples that need a Docker engine, a registry, signing keys, sbatch or a
particular host's GPUs are marked ``# doctest: +SKIP``: they show the call, not a result that
holds everywhere.
"""

from __future__ import annotations

import doctest
import importlib
import json
import os
import pkgutil
import tempfile
from pathlib import Path

import pytest

from devtools.support import copy_project

PACKAGES = ("builder", "bench", "devtools")
MODULES = sorted(
    name
    for package in PACKAGES
    for name in [package]
    + [m.name for m in pkgutil.walk_packages(importlib.import_module(package).__path__, f"{package}.")]
    if not name.endswith(".__main__")
)


@pytest.fixture(scope="module")
def project_copy(tmp_path_factory) -> Path:
    return copy_project(tmp_path_factory.mktemp("doctest") / "project")


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, project_copy, monkeypatch):
    from builder.config.project import load_project

    monkeypatch.chdir(project_copy)
    monkeypatch.setenv("XDG_CACHE_HOME", str(project_copy.parent / "cache"))  # leases, ledgers (an sbatch script's)
    monkeypatch.setattr(tempfile, "tempdir", str(project_copy.parent))  # the examples' mkdtemp()
    project = load_project("matrix.yaml")
    targets = {t.vendor: t for t in reversed(project.targets)}  # the first target of each vendor
    names = {
        "project": project,
        "cpu": project.target("cpu").default_view,  # a view: what a build, a lock or a push takes
        "cpu_target": project.target("cpu"),
        "amd_target": targets["amd"],
        "json": json,
        "os": os,
        "Path": Path,
    }
    module = importlib.import_module(name)
    result = doctest.testmod(
        module, extraglobs=names, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert result.failed == 0
