"""The layer plan: which layer each locked wheel goes into, the build arguments that carry them,
the rendered steps, and bad plans refused with one line."""

from __future__ import annotations

import pytest
import yaml
from helpers import run_builder

from builder.config.project import load_project
from builder.images import content, render
from builder.wheels import layers
from builder.wheels.lockfile import Pin
from devtools.support import edit_matrix


def pin(name: str, version: str = "1.0") -> Pin:
    return Pin(name, version, "0" * 64, f"{name.replace('-', '_')}-{version}-py3-none-any.whl")


def test_repo_plan_of_nvidia_cu130_groups_by_vendor_library_then_torch(project):
    """The repo's own lock: no layer above ~1.1 GB of wheels, every nvidia-* below torch, accelerate apart."""
    proj = load_project(project / "matrix.yaml")
    for view in proj.target("nvidia-cu130").views():
        plan = {layer.name: [p.name for p in layer.pins] for layer in layers.layer_plan(proj, view)}
        assert list(plan) == ["cuda-dnn", "cuda-blas", "cuda-solvers", "cuda-runtime", "triton", "torch",
                              "accelerate", "packages"]
        assert plan["cuda-dnn"] == ["nvidia-cudnn-cu13"]
        assert plan["torch"] == ["torch"] and plan["triton"] == ["triton"] and plan["accelerate"] == ["accelerate"]
        below_torch = [n for layer in ("cuda-dnn", "cuda-blas", "cuda-solvers", "cuda-runtime") for n in plan[layer]]
        assert {n for n in below_torch} >= {"nvidia-cublas", "nvidia-nccl-cu13", "nvidia-cuda-runtime"}
        assert plan["packages"] == []
        locked = sum(len(names) for names in plan.values())
        assert locked == (project / view.lock).read_text().count("--hash=")  # every wheel, once


def test_cpu_plan_has_no_vendor_layers(project):
    proj = load_project(project / "matrix.yaml")
    cpu = proj.target("cpu")
    assert cpu.layers == ["torch", "accelerate", "packages"]  # triton and the cuda-* layers are other backends'


def test_first_matching_layer_wins_and_the_rest_goes_last(project):
    proj = load_project(project / "matrix.yaml")
    assert layers.layer_of(proj.matrix, "cuda", "nvidia_cusparselt_cu13") == "cuda-blas"
    assert layers.layer_of(proj.matrix, "cuda", "nvidia-ml-py") == "cuda-runtime"
    assert layers.layer_of(proj.matrix, "cpu", "nvidia-ml-py") == "packages"  # cuda layers are cuda's only
    assert layers.layer_of(proj.matrix, "cuda", "einops") == "packages"


def test_build_args_carry_each_layers_hashed_pins(project):
    """WHEELS_<LAYER> holds `name==version --hash=sha256:<hex>` pairs that the RUN's printf writes back as lines."""
    proj = load_project(project / "matrix.yaml")
    view = proj.target("nvidia-cu130").on("linux/amd64")
    args = content.build_args(proj, view)
    assert set(args) == {"BASE", "WHEELS_TOOLS", "WHEELS_COMMON", "WHEELS_CUDA_DNN", "WHEELS_CUDA_BLAS",
                         "WHEELS_CUDA_SOLVERS", "WHEELS_CUDA_RUNTIME", "WHEELS_TRITON", "WHEELS_TORCH",
                         "WHEELS_ACCELERATE", "WHEELS_PACKAGES"}
    words = args["WHEELS_TORCH"].split(" ")
    assert len(words) == 2 and words[0] == "torch==2.14.1" and words[1].startswith("--hash=sha256:")
    assert args["WHEELS_TOOLS"].startswith("uv==") and args["WHEELS_PACKAGES"] == ""
    assert "numpy==" in args["WHEELS_COMMON"]


def test_rendered_dockerfile_has_one_step_per_layer_in_plan_order(project):
    proj = load_project(project / "matrix.yaml")
    text = render.render(proj, [proj.target("nvidia-cu130")]).popitem()[1]
    order = [line.split()[1] for line in text.splitlines() if line.startswith("ARG WHEELS_")]
    assert order == ["WHEELS_TOOLS", "WHEELS_COMMON", "WHEELS_CUDA_DNN", "WHEELS_CUDA_BLAS",
                     "WHEELS_CUDA_SOLVERS", "WHEELS_CUDA_RUNTIME", "WHEELS_TRITON", "WHEELS_TORCH",
                     "WHEELS_ACCELERATE", "WHEELS_PACKAGES"]
    # The packages layer comes after the runtime: targets differing only in packages share the rest.
    assert text.index("target=/tmp/examples") < text.index('if [ -n "$WHEELS_PACKAGES" ]')
    # Each layer's RUN mounts its own wheels' context and uv from the tools stage, nothing else.
    for layer in ("cuda-dnn", "torch", "packages"):
        run = next(block for block in text.split("\nRUN ") if f'"$WHEELS_{layer.upper().replace("-", "_")}"' in block)
        mounts = [m for m in run.split() if m.startswith("--mount=type=bind,")]
        assert mounts == ["--mount=type=bind,from=tools,source=/opt/uv,target=/tmp/uv",
                          f"--mount=type=bind,from=wheels-{layer},target=/tmp/wheels/{layer}"], mounts
    # uv is installed once, in the tools stage (its locked wheel checked, its binary taken out), which no
    # other stage is built on.
    assert text.count("/opt/uv/bin/uv\n") == 1 and text.count("sha256sum --check") == 1 and "FROM tools" not in text
    # No lock file is copied in: a layer's cache key is its own wheels (and those below), nothing else.
    assert not [line for line in text.splitlines() if line.startswith(("COPY ", "ADD ")) and ".lock" in line]


def test_content_tag_follows_one_layers_wheels(project):
    """A changed pin in the lock changes the content tag (the wheels reach the build as arguments)."""
    proj = load_project(project / "matrix.yaml")
    cpu = proj.target("cpu").default_view
    before = content.content_tags(proj, [cpu])["cpu"]
    lock = project / cpu.lock
    lock.write_text(lock.read_text().replace("accelerate==1.15.0 --hash=sha256:9", "accelerate==1.15.0 --hash=sha256:8"))
    assert content.content_tags(proj, [cpu])["cpu"] != before


def test_default_plan_puts_every_wheel_in_one_layer(project):
    doc = edit_matrix(project)
    doc.pop("layers")
    (project / "matrix.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    proj = load_project(project / "matrix.yaml")
    plan = layers.layer_plan(proj, proj.target("nvidia-cu130").on("linux/amd64"))
    assert [(layer.name, len(layer.pins)) for layer in plan] == [("wheels", 22), ("packages", 0)]


def test_a_startup_import_left_for_the_last_layer_is_refused(project):
    """The packages layer is above the bytecode step that imports torch: torch may not land there."""
    edit_matrix(project, layers=[{"name": "cuda", "match": ["nvidia-*"]}])
    proc = run_builder("print", "-t", "cpu", cwd=project)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "accelerate, torch (cpu) matches no layer" in proc.stderr and "add a layer that matches it" in proc.stderr


def test_plan_from_given_pins_keeps_lock_order(project):
    proj = load_project(project / "matrix.yaml")
    view = proj.target("nvidia-cu130").on("linux/amd64")
    plan = layers.layer_plan(proj, view, [pin("torch"), pin("nvidia-nccl-cu13"), pin("nvidia-cublas"), pin("einops")])
    assert [(layer.name, [p.name for p in layer.pins]) for layer in plan if layer.pins] == [
        ("cuda-blas", ["nvidia-cublas"]), ("cuda-runtime", ["nvidia-nccl-cu13"]), ("torch", ["torch"]),
        ("packages", ["einops"])]


@pytest.mark.parametrize(("plan", "message"), [
    ([{"name": "packages", "match": ["x"]}], "'packages' is used twice or reserved"),
    ([{"name": "tools", "match": ["x"]}], "'tools' is used twice or reserved"),
    ([{"name": "common", "match": ["x"]}], "'common' is used twice or reserved"),
    ([{"name": "a", "match": ["x"]}, {"name": "a", "match": ["y"]}], "'a' is used twice or reserved"),
    ([{"name": "Bad_Name", "match": ["x"]}], "a layer name like cuda-dnn"),
    ([{"name": "a", "match": ["x y"]}], "a wheel-name pattern like nvidia-cublas*"),
    ([{"name": "a", "match": []}], "layers"),
    ([], "layers"),
    ([{"name": "a", "match": ["x"], "backends": ["tpu"]}], "layers"),
])
def test_bad_plan_is_one_line_and_exit_2(project, plan, message):
    edit_matrix(project, layers=plan)
    proc = run_builder("render", cwd=project)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_print_shows_each_platforms_plan(project):
    import json

    proc = run_builder("print", "-t", "nvidia-cu130", cwd=project)
    assert proc.returncode == 0, proc.stderr
    target = json.loads(proc.stdout)["targets"][0]
    assert set(target["layers"]) == {"linux/amd64", "linux/arm64"}
    amd64 = {layer["name"]: layer["wheels"] for layer in target["layers"]["linux/amd64"]}
    assert amd64["torch"] == ["torch==2.14.1"] and amd64["cuda-dnn"][0].startswith("nvidia-cudnn-cu13==")
