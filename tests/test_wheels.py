"""Wheel resolution pieces that need no engine: platform tags, lock files, lock reuse."""

from __future__ import annotations

import pytest

from builder import wheels
from builder.errors import TargetFailed
from builder.project import load_project
from builder.registry import Ref


@pytest.fixture
def proj(project):
    return load_project(project / "matrix.yaml")


def test_platform_args_list_every_manylinux_tag_of_the_image_glibc(proj):
    args = wheels.platform_args(proj)
    tags = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    arch = tags[0].rsplit("_", 2)[-2] + "_" + tags[0].rsplit("_", 1)[-1]
    assert tags[0] == f"manylinux_2_36_{arch}"  # bookworm's glibc
    assert f"manylinux_2_28_{arch}" in tags and f"manylinux_2_17_{arch}" in tags and f"manylinux_2_5_{arch}" in tags
    assert {f"manylinux2014_{arch}", f"manylinux1_{arch}"} <= set(tags)
    assert "--only-binary=:all:" in args and args[args.index("--python-version") + 1] == "3.11"


def test_lock_round_trip(tmp_path):
    pins = [wheels.Pin("torch", "2.13.0+cpu", "a" * 64, "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"),
            wheels.Pin("Accelerate", "1.0", "b" * 64, "accelerate-1.0-py3-none-any.whl")]
    path = tmp_path / "requirements.lock"
    wheels.write_lock(path, "target cpu", "sha256:f00", pins)
    fingerprint, read = wheels.read_lock(path)
    assert fingerprint == "sha256:f00"
    assert [p.name for p in read] == ["Accelerate", "torch"]  # sorted by canonical name
    assert set(read) == set(pins)
    assert "--hash=sha256:" + "a" * 64 in path.read_text()


def test_unchanged_lock_is_reused_without_pip(proj, tmp_path, monkeypatch):
    """A no-op build must not re-resolve: with inputs unchanged and wheels present, pip never runs."""
    monkeypatch.setenv("BUILDER_WHEELHOUSE", str(tmp_path / "house"))
    (tmp_path / "house").mkdir()
    pins = [wheels.Pin("uv", "0.13.9", "c" * 64, "uv-0.13.9-py3-none-any.whl")]
    (tmp_path / "house" / pins[0].filename).write_bytes(b"stand-in wheel")
    lock = tmp_path / "tools.lock"
    wheels.write_lock(lock, "tools", "sha256:same", pins)

    def no_pip(*_a, **_k):
        raise AssertionError("pip ran although the lock was current")

    monkeypatch.setattr(wheels, "_pip", no_pip)
    assert wheels._ensure(lock, "tools", "sha256:same", lambda: no_pip()) == pins
    with pytest.raises(AssertionError, match="pip ran"):
        wheels._ensure(lock, "tools", "sha256:changed", lambda: no_pip())


def test_index_reachable_reports_why(tmp_path):
    assert wheels.index_reachable(f"file://{tmp_path}") is None
    assert wheels.index_reachable(f"file://{tmp_path}/missing") == "no such folder"
    reason = wheels.index_reachable("http://127.0.0.1:9/simple", timeout=2)
    assert reason and "refused" in reason.lower()


def test_unreachable_index_message_names_index_and_mirror(proj, monkeypatch):
    target = proj.target("amd-rocm5.7")
    monkeypatch.setattr(wheels, "index_reachable", lambda url, timeout=8.0: "Name or service not known")
    monkeypatch.setattr(wheels, "resolve", lambda *a, **k: (_ for _ in ()).throw(TargetFailed("no match")))
    monkeypatch.setattr(wheels, "read_lock", lambda path: (None, []))
    with pytest.raises(TargetFailed) as exc:
        wheels.target_lock(proj, target, [])
    text = str(exc.value)
    assert "https://download.pytorch.org/whl/rocm5.7" in text and "BUILDER_INDEX_ROCM5_7=URL" in text


@pytest.mark.parametrize(
    ("ref", "parts"),
    [
        ("localhost:5000/ml-runtime:cpu", ("localhost:5000", "ml-runtime", "cpu", None)),
        ("127.0.0.1:5000/a/b@sha256:" + "d" * 64, ("127.0.0.1:5000", "a/b", None, "sha256:" + "d" * 64)),
        ("registry.example/team/img:v1.2", ("registry.example", "team/img", "v1.2", None)),
    ],
)
def test_ref_parse(ref, parts):
    r = Ref.parse(ref)
    assert (r.host, r.repository, r.tag, r.digest) == parts
