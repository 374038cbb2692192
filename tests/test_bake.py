"""The bake file mirrors the matrix: ``builder bake`` and :mod:`builder.images.bake` (no engine needed)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from builder.config.project import load_project
from builder.images import bake, content
from builder.images import plan as plans
from builder.wheels import layers, wheelhouse
from devtools.support import REPO


def _project():
    return load_project(REPO / "matrix.yaml")


def test_bake_round_trips_the_matrix():
    project = _project()
    definition = json.loads(json.dumps(bake.bake_definition(project, project.targets)))
    assert set(definition) == {"group", "target"}
    views = [v for t in project.targets for v in t.views()]
    assert set(definition["target"]) == {bake.view_name(v) for v in views}
    for view in views:
        spec = definition["target"][bake.view_name(view)]
        assert spec["labels"]["io.ml-image-builder.target"] == view.name
        assert spec["platforms"] == [view.platform] and spec["args"] == content.build_args(project, view)
        assert spec["args"]["BASE"] == project.base_for(view.platform)
        assert spec["tags"] == (view.platform_refs or view.refs) and spec["dockerfile"] == view.dockerfile
        assert spec["labels"] == view.labels
        # the registry cache `build --push` publishes, then the published image (a classic-store push's inline record)
        assert spec["cache-from"] == [f"type=registry,ref={plans.cache_ref(view)}", f"type=registry,ref={view.primary_ref}"]
        assert spec["cache-to"] == [], "an inline record would make the image's digest this machine's alone"
    assert "nvidia-cu130-arm64" in definition["target"] and "cpu" in definition["target"]
    for group in ["default", "all", *project.matrix.groups]:
        members = definition["group"][bake.bake_name(group)]["targets"]
        assert members == [bake.view_name(v) for n in project.matrix.group(group) for v in project.target(n).views()]


def test_bake_definition_has_the_shape_bake_accepts():
    """What `docker buildx bake --print` checks: names, references, and each field's type."""
    project = _project()
    definition = bake.bake_definition(project, project.targets)
    strings = {"context", "dockerfile"}
    string_lists = {"tags", "cache-from", "cache-to", "platforms", "output"}
    for name, spec in definition["target"].items():
        assert bake.BAKE_NAME.fullmatch(name), name
        assert set(spec) <= strings | string_lists | {"labels", "contexts", "args"}, set(spec)
        assert "network" not in spec and "extra-hosts" not in spec, "builds reach no network and no host"
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in spec["args"].items())
        assert all(isinstance(spec[k], str) for k in strings & set(spec))
        assert all(isinstance(v, str) for k in string_lists & set(spec) for v in spec[k])
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in spec["labels"].items())
        assert (project.root / spec["dockerfile"]).is_file()
        for entry in spec["cache-from"] + spec["cache-to"]:
            fields = dict(part.split("=", 1) for part in entry.split(","))
            assert fields["type"] in {"registry", "inline"}
        output = dict(part.split("=", 1) for part in spec["output"][0].split(","))
        assert output["type"] == "docker" and output["compression"] == project.target(
            spec["labels"]["io.ml-image-builder.target"]).compression, "the matrix's compression reaches bake"
    for name, group in definition["group"].items():
        assert bake.BAKE_NAME.fullmatch(name), name
        assert set(group) == {"targets"}
        assert set(group["targets"]) <= set(definition["target"]), (name, group)
    assert "default" in definition["group"]
    for spec in definition["target"].values():
        target = project.target(spec["labels"]["io.ml-image-builder.target"])
        view = next(v for v in target.views() if v.platform == spec["platforms"][0])
        assert set(spec["contexts"]) == {layers.context_name(layer) for layer in layers.context_layers(project, view)}
        assert all(isinstance(v, str) for v in spec["contexts"].values())


def test_bake_subset_keeps_groups_consistent():
    project = _project()
    definition = bake.bake_definition(project, project.select(["cpu"]))
    assert list(definition["target"]) == ["cpu"]
    assert all(g["targets"] == ["cpu"] for g in definition["group"].values())


def test_bake_command_prints_and_writes(tmp_path):
    from builder.cli.images import bake_cmd

    runner = CliRunner()
    printed = runner.invoke(bake_cmd, ["--matrix", str(REPO / "matrix.yaml"), "--print", "-t", "cpu"])
    assert printed.exit_code == 0, printed.output
    assert list(json.loads(printed.output)["target"]) == ["cpu"]
    out = tmp_path / "bake.json"
    written = runner.invoke(bake_cmd, ["--matrix", str(REPO / "matrix.yaml"), "-o", str(out), "-t", "cpu"])
    assert written.exit_code == 0, written.output
    assert json.loads(out.read_text()) == bake.bake_definition(_project(), _project().select(["cpu"]))
    # The wheels the file points at are staged, one folder per layer, exactly the locked files (and the marker).
    cpu = _project().target("cpu").default_view
    contexts = json.loads(out.read_text())["target"]["cpu"]["contexts"]
    for layer, pins in layers.context_layers(_project(), cpu).items():
        folder = Path(contexts[layers.context_name(layer)])
        assert sorted(p.name for p in folder.iterdir()) == sorted([wheelhouse.MARKER, *(p.filename for p in pins)]), layer
