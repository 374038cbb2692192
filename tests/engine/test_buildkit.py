"""The BuildKit path gives the same image as the classic builder; the bake file mirrors the matrix."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import REPO, edit_matrix

from builder import bake, buildkit, render, wheels, wheelserver
from builder.errors import UserError
from builder.project import load_project

engine = pytest.mark.engine


def _registry_of(root: Path) -> str:
    import yaml

    return yaml.safe_load((root / "matrix.yaml").read_text())["registry"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _require_cli() -> None:
    try:
        buildkit.find_cli()
    except UserError as exc:
        if os.environ.get("CI"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def _tree(engine, image: str) -> dict[str, tuple]:
    """``docker export`` of a created (never started) container: path -> (type, size, mode, uid, gid, link)."""
    container = engine.api.create_container(image)["Id"]
    try:
        stream = engine.api.export(container)
        tree = {}

        class _Reader:  # tarfile's stream mode wants .read(n) over the chunked HTTP body
            def __init__(self):
                self.buffer, self.chunks = b"", iter(stream)

            def read(self, n: int) -> bytes:
                while len(self.buffer) < n:
                    try:
                        self.buffer += next(self.chunks)
                    except StopIteration:
                        break
                out, self.buffer = self.buffer[:n], self.buffer[n:]
                return out

        with tarfile.open(fileobj=_Reader(), mode="r|") as tar:
            for m in tar:
                tree[m.name.rstrip("/")] = (m.type, m.size, stat.S_IMODE(m.mode), m.uid, m.gid, m.linkname)
        return tree
    finally:
        engine.api.remove_container(container, force=True)


@engine
def test_buildkit_image_matches_classic(cpu_project, engine):
    """Build cpu with BuildKit and compare config and file tree with the classic-builder image."""
    _require_cli()
    project = load_project(cpu_project / "matrix.yaml")
    target = project.target("cpu")
    render.write(render.render(project, [target]))
    assert wheels.lock_all(project, [target], print) == {}
    with wheelserver.serve(wheels.wheelhouse(), project.matrix.wheelhouse_port) as wheels_at:
        image_id, steps, cached = buildkit.buildkit_build(project, target, wheels_at=wheels_at)
    try:
        assert steps >= 9 and 0 <= cached <= steps, (steps, cached)
        classic = engine.api.inspect_image(f"{_registry_of(cpu_project)}:cpu")["Config"]
        ours = engine.api.inspect_image(image_id)["Config"]
        for key in ("User", "WorkingDir", "Entrypoint", "Cmd", "Env"):
            assert ours[key] == classic[key], key
        assert target.labels.items() <= ours["Labels"].items()
        # Build labels too: neither copy is a git checkout, so both say revision "unknown".
        assert ours["Labels"] == classic["Labels"]
        a, b = _tree(engine, image_id), _tree(engine, f"{_registry_of(cpu_project)}:cpu")
        # No exclusions needed: mtimes are not compared; /.dockerenv, /etc/hosts, /etc/hostname and
        # /etc/resolv.conf are the engine's per-container files, made the same way for both images.
        only_bk, only_classic = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        assert not only_bk and not only_classic, (only_bk[:20], only_classic[:20])
        differ = [(p, a[p], b[p]) for p in sorted(a) if a[p] != b[p]]
        assert not differ, differ[:20]
        assert len(a) > 5000  # a whole venv with torch, not an empty export
    finally:
        engine.api.remove_image(image_id, force=True)


@engine
def test_buildkit_failure_names_the_step(based_project, tmp_path):
    """A failing RUN raises TargetFailed with BuildKit's error lines (no wheel server: pip can't fetch)."""
    from builder.errors import TargetFailed

    _require_cli()
    root = tmp_path / "project"
    shutil.copytree(based_project, root, ignore=shutil.ignore_patterns("dist"))
    edit_matrix(root, wheelhouse_port=_free_port())  # nothing listens there, on any 127.0.0.x
    project = load_project(root / "matrix.yaml")
    target = project.target("cpu")
    render.write(render.render(project, [target]))
    with pytest.raises(TargetFailed) as info:
        buildkit.buildkit_build(project, target, stage="common")
    text = str(info.value)
    assert "BuildKit build of cpu failed" in text and "RUN " in text and "tools.lock" in text, text


def _fake_docker(folder: Path, version: str, buildx: bool) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "docker"
    path.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = "--version" ] && {{ echo "Docker version {version}, build abc"; exit 0; }}\n'
        f'[ "$1" = "buildx" ] && exit {0 if buildx else 1}\n'
        "exit 1\n"
    )
    path.chmod(0o755)
    return str(path)


def test_find_cli_prefers_buildx_then_old_clients(tmp_path):
    new = _fake_docker(tmp_path / "new", "28.2.2", buildx=False)
    old = _fake_docker(tmp_path / "old", "20.10.24+dfsg1", buildx=False)
    plugin = _fake_docker(tmp_path / "plugin", "28.2.2", buildx=True)
    assert buildkit.find_cli([new, old]) == buildkit.Cli(old, buildx=False)
    assert buildkit.find_cli([new, old, plugin]) == buildkit.Cli(plugin, buildx=True)
    with pytest.raises(UserError) as info:
        buildkit.find_cli([new])
    message = str(info.value)
    assert new in message and "28.2.2" in message and "buildx" in message and "docker.io" in message


def test_plain_progress_step_counting():
    lines = """#4 [common 1/3] FROM base@sha256:abc
#4 CACHED
#5 [common 2/3] RUN groupadd app
#5 CACHED
#6 [common 3/3] COPY a /a
#6 0.1 copying
#6 [common 3/3] COPY a /a
#7 [torch 1/1] RUN pip install torch
#7 ERROR: executor failed running [/bin/sh -c pip install torch]: exit code: 1
#8 exporting to image
#8 CACHED""".splitlines()
    steps = buildkit._Steps({}, set(), [])
    seen = [s for s in map(steps.feed, lines) if s]
    assert seen == [(2, 3, "[common] RUN groupadd app"), (3, 3, "[common] COPY a /a"),
                    (1, 1, "[torch] RUN pip install torch")]
    assert steps.counts() == (3, 1)  # FROM and "exporting" are not steps; COPY reprinted once
    error = "RUN pip install torch: executor failed running [/bin/sh -c pip install torch]: exit code: 1"
    assert steps.errors == [error]


def _project():
    return load_project(REPO / "matrix.yaml")


def test_bake_round_trips_the_matrix():
    project = _project()
    definition = json.loads(json.dumps(bake.bake_definition(project, project.targets)))
    assert set(definition) == {"group", "target"}
    by_name = {t["labels"]["io.ml-image-builder.target"]: (name, t) for name, t in definition["target"].items()}
    assert set(by_name) == {t.name for t in project.targets}
    for target in project.targets:
        name, spec = by_name[target.name]
        assert name == bake.bake_name(target.name)
        assert spec["tags"] == target.refs and spec["dockerfile"] == target.dockerfile
        assert spec["labels"] == target.labels
        assert spec["cache-from"] == [f"type=registry,ref={target.primary_ref}"]
    real = {bake.bake_name(t.name): t.name for t in project.targets}
    for group in ["default", "all", *project.matrix.groups]:
        members = definition["group"][bake.bake_name(group)]["targets"]
        assert [real[m] for m in members] == project.matrix.group(group)


def test_bake_definition_has_the_shape_bake_accepts():
    """What `docker buildx bake --print` checks: names, references, and each field's type."""
    project = _project()
    definition = bake.bake_definition(project, project.targets)
    strings = {"context", "dockerfile", "network"}
    string_lists = {"tags", "cache-from", "cache-to"}
    for name, spec in definition["target"].items():
        assert bake.BAKE_NAME.fullmatch(name), name
        assert set(spec) <= strings | string_lists | {"labels", "extra-hosts"}, set(spec)
        assert all(isinstance(spec[k], str) for k in strings & set(spec))
        assert all(isinstance(v, str) for k in string_lists & set(spec) for v in spec[k])
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in spec["labels"].items())
        assert (project.root / spec["dockerfile"]).is_file()
        for entry in spec["cache-from"] + spec["cache-to"]:
            fields = dict(part.split("=", 1) for part in entry.split(","))
            assert fields["type"] in {"registry", "inline"}
    for name, group in definition["group"].items():
        assert bake.BAKE_NAME.fullmatch(name), name
        assert set(group) == {"targets"}
        assert set(group["targets"]) <= set(definition["target"]), (name, group)
    assert "default" in definition["group"]
    for spec in definition["target"].values():
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in spec["extra-hosts"].items())


def test_bake_subset_keeps_groups_consistent():
    project = _project()
    definition = bake.bake_definition(project, project.select(["cpu"]))
    assert list(definition["target"]) == ["cpu"]
    assert all(g["targets"] == ["cpu"] for g in definition["group"].values())


def test_bake_command_prints_and_writes(tmp_path):
    from builder.commands_scale import bake_cmd

    runner = CliRunner()
    printed = runner.invoke(bake_cmd, ["--matrix", str(REPO / "matrix.yaml"), "--print", "-t", "cpu"])
    assert printed.exit_code == 0, printed.output
    assert list(json.loads(printed.output)["target"]) == ["cpu"]
    out = tmp_path / "bake.json"
    written = runner.invoke(bake_cmd, ["--matrix", str(REPO / "matrix.yaml"), "-o", str(out)])
    assert written.exit_code == 0, written.output
    assert json.loads(out.read_text()) == bake.bake_definition(_project(), _project().select([], group="all"))
