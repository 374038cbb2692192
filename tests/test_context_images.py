"""The wheel contexts' images (builder.oci.contextimages, builder.wheels.images), without an engine: the
layer is the folder's files and nothing else of the machine (times, owners, modes, order of creation),
so the same wheels give the same image everywhere; the archive is what ``docker load`` reads."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from builder.oci import contextimages
from builder.wheels import images
from builder.wheels.lockfile import Pin

LONG = "nvidia_cusparselt_cu13-0.8.1-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl"


def _folder(root: Path, files: dict[str, bytes], mtime: int, mode: int) -> Path:
    root.mkdir()
    for name in reversed(list(files)):  # created in another order than the layer lists them
        path = root / name
        path.write_bytes(files[name])
        path.chmod(mode)
        os.utime(path, (mtime, mtime))
    return root


def _archive(folder: Path, platform: str = "linux/amd64") -> tuple[tarfile.TarFile, contextimages.Archive]:
    archive = contextimages.Archive(folder, "wheels-torch", "ab" * 32, platform)
    data = b"".join(archive)
    return tarfile.open(fileobj=io.BytesIO(data)), archive


FILES = {"a-1.0-py3-none-any.whl": b"a" * 1000, LONG: b"b" * 513, ".ml-image-builder-layer": b"torch\n"}


def test_the_layer_is_the_files_alone_in_name_order_with_fixed_owner_mode_and_time(tmp_path):
    outer, archive = _archive(_folder(tmp_path / "f", FILES, mtime=1_700_000_000, mode=0o600))
    layer_bytes = outer.extractfile("layer.tar").read()  # type: ignore[union-attr]
    assert archive.diff_id == f"sha256:{hashlib.sha256(layer_bytes).hexdigest()}"
    assert contextimages.diff_id(tmp_path / "f") == archive.diff_id  # the check reads what the load wrote
    layer = tarfile.open(fileobj=io.BytesIO(layer_bytes))
    members = layer.getmembers()
    assert [m.name for m in members] == sorted(FILES)
    assert {(m.mode, m.uid, m.gid, m.uname, m.gname, m.mtime) for m in members} == {
        (0o644, 0, 0, "", "", contextimages.FIXED_MTIME)}
    assert {m.name: layer.extractfile(m).read() for m in members} == FILES  # type: ignore[union-attr]
    # docker load reads the manifest, which names the config, which names the layer's digest
    manifest = json.loads(outer.extractfile("manifest.json").read())  # type: ignore[union-attr]
    assert manifest == [{"Config": "config.json", "RepoTags": [contextimages.ref("wheels-torch", "ab" * 32)],
                         "Layers": ["layer.tar"]}]
    config = json.loads(outer.extractfile("config.json").read())  # type: ignore[union-attr]
    assert config["rootfs"] == {"type": "layers", "diff_ids": [archive.diff_id]}
    assert (config["os"], config["architecture"]) == ("linux", "amd64")
    assert config["config"]["Labels"] == {contextimages.LABEL: "wheels-torch"}


def test_the_same_files_give_the_same_image_on_any_machine(tmp_path):
    one = _archive(_folder(tmp_path / "one", FILES, mtime=1_000_000_000, mode=0o644))[1]
    two = _archive(_folder(tmp_path / "two", FILES, mtime=1_800_000_000, mode=0o664))[1]
    assert one.diff_id == two.diff_id
    changed = _archive(_folder(tmp_path / "three", {**FILES, LONG: b"c" * 513}, mtime=0, mode=0o644))[1]
    assert changed.diff_id != one.diff_id


def test_an_arm64_image_says_so_and_its_layer_is_the_same(tmp_path):
    folder = _folder(tmp_path / "f", FILES, mtime=0, mode=0o644)
    outer, archive = _archive(folder, "linux/arm64/v8")
    config = json.loads(outer.extractfile("config.json").read())  # type: ignore[union-attr]
    assert (config["architecture"], config["variant"]) == ("arm64", "v8")
    assert archive.diff_id == contextimages.diff_id(folder)


def test_a_folder_that_is_not_flat_files_is_refused_by_name(tmp_path):
    folder = _folder(tmp_path / "f", FILES, mtime=0, mode=0o644)
    (folder / "sub").mkdir()
    with pytest.raises(ValueError, match=r"f/sub is not a regular file"):
        contextimages.Archive(folder, "wheels-torch", "ab" * 32, "linux/amd64")


def test_a_file_that_changes_size_while_it_is_written_fails_the_load(tmp_path):
    folder = _folder(tmp_path / "f", {"a.whl": b"a" * 3_000_000}, mtime=0, mode=0o644)
    archive = iter(contextimages.Archive(folder, "wheels-torch", "ab" * 32, "linux/amd64"))
    next(archive)  # the layer's entry: its size is fixed now
    (folder / "a.whl").write_bytes(b"a" * 10)
    with pytest.raises(OSError, match="a.whl shrank"):
        list(archive)


def _pin(name: str, sha: str) -> Pin:
    return Pin(name, "1.0", sha, f"{name}-1.0-py3-none-any.whl")


def test_an_image_is_named_by_platform_layer_and_locked_hashes_not_by_order():
    a, b = _pin("a", "1" * 64), _pin("b", "2" * 64)
    ref = images.refs({"torch": [a, b]}, "linux/amd64")["wheels-torch"]
    assert ref.startswith("ml-image-builder.invalid/contexts/wheels-torch:")
    assert images.refs({"torch": [b, a]}, "linux/amd64")["wheels-torch"] == ref
    assert images.refs({"torch": [a, b]}, "linux/arm64")["wheels-torch"] != ref
    assert images.refs({"torch": [a, _pin("b", "3" * 64)]}, "linux/amd64")["wheels-torch"] != ref
    assert images.refs({"common": [a, b]}, "linux/amd64")["wheels-common"].split(":")[-1] != ref.split(":")[-1]
