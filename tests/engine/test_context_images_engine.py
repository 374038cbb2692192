"""The wheel contexts as images of the engine's store (builder.wheels.images) on a real engine: a
staged layer is loaded once, a build reads it in place (nothing sent from the client, no copy in
BuildKit's cache), and an image at its name that is not the one the folder gives is loaded again.

The wheelhouse and the state folder are the test's own; the images it loads are removed after it.
Skipped where the engine's builds can't read an image in place (the classic store: folders there)."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest
from helpers import fetch_wheels

from builder.oci import contextimages
from builder.wheels import contexts, images, wheelhouse
from builder.wheels.lockfile import Pin

pytestmark = pytest.mark.engine


@pytest.fixture
def house(tmp_path, monkeypatch) -> Path:
    own = tmp_path / "house"
    own.mkdir()
    monkeypatch.setenv("BUILDER_WHEELHOUSE", str(own))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "state"))
    return own


def _build(ref: str, out: Path) -> str:
    """A build that copies the context out (to a folder, nothing stored); its plain progress."""
    out.parent.mkdir(parents=True)
    (out.parent / "Dockerfile").write_text("FROM scratch\nCOPY --from=wheels-tools / /w/\n")
    done = subprocess.run(["docker", "buildx", "build", "--progress=plain", "--build-context",
                           f"wheels-tools={images.SCHEME}{ref}", "--output", f"type=local,dest={out}", str(out.parent)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


def test_a_layer_is_loaded_once_read_in_place_and_loaded_again_when_its_name_is_another_image(
        engine, house, tmp_path):
    if not engine.serves_image_contexts(None):
        pytest.skip("this engine's builds read a folder context (the classic store): no context images")
    payload = f"wheel {uuid.uuid4().hex}".encode() * 1000
    pin = Pin("zz-ctx", "1.0", hashlib.sha256(payload).hexdigest(), "zz_ctx-1.0-py3-none-any.whl")
    fetch_wheels({pin.filename: payload})
    layers = {"tools": [pin]}
    folder = contexts.build_context(layers)
    ref = images.refs(layers, "linux/amd64")["wheels-tools"]
    said: list[str] = []
    try:
        served = images.serve(engine, folder, layers, "linux/amd64", said.append)
        assert list(served) == ["wheels-tools"] and served["wheels-tools"][0] == ref
        assert len(said) == 1 and said[0].startswith("wheels: wheels-tools loaded into the image store as " + ref)
        layer = engine.image(ref).layers
        assert layer == (contextimages.diff_id(folder / "tools"),)

        progress = _build(ref, tmp_path / "build" / "out")
        assert (tmp_path / "build/out/w" / pin.filename).read_bytes() == payload
        assert "[context wheels-tools] " + ref in progress
        assert "load from client" not in progress and "transferring wheels-tools" not in progress

        images.serve(engine, folder, layers, "linux/amd64", said.append)
        assert len(said) == 1, "an image in place was loaded again"

        # Another folder of the same wheels (another target's) has no diff ID recorded: the folder is
        # hashed, not loaded again, and its diff ID recorded.
        with wheelhouse.editing(wheelhouse.location(), said.append) as book:
            book[wheelhouse.context_key(folder)].facts.pop(images.DIFF_IDS)
        images.serve(engine, folder, layers, "linux/amd64", said.append)
        assert len(said) == 1
        assert wheelhouse.records()[wheelhouse.context_key(folder)].facts[images.DIFF_IDS] == {"tools": layer[0]}

        # Someone tags another image with the name: it is not the folder's, so it is loaded again.
        engine.tag(engine.image(served["wheels-tools"][1]).id, "zz-ctx-test:keep")
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w") as tar:
            info = tarfile.TarInfo("not-a-wheel")
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
        engine.client.api.import_image_from_data(data.getvalue(), repository="zz-ctx-test", tag="other")
        engine.tag("zz-ctx-test:other", ref)
        assert engine.image(ref).layers != layer
        images.serve(engine, folder, layers, "linux/amd64", said.append)
        assert len(said) == 2 and engine.image(ref).layers == layer
    finally:
        for name in (ref, "zz-ctx-test:keep", "zz-ctx-test:other"):
            engine.remove_image(name)


def test_each_image_is_handed_over_as_soon_as_it_is_in_place(engine, house):
    """A run stopped between two loads has recorded every image it loaded: the first layer's image
    reaches *on_served* before the second is loaded, and here the second fails (its folder holds
    a subfolder, which no context image takes)."""
    if not engine.serves_image_contexts(None):
        pytest.skip("this engine's builds read a folder context (the classic store): no context images")
    pins = {}
    for layer in ("tools", "common"):
        payload = f"{layer} {uuid.uuid4().hex}".encode() * 100
        pins[layer] = Pin(f"zz-{layer}", "1.0", hashlib.sha256(payload).hexdigest(), f"zz_{layer}-1.0-py3-none-any.whl")
        fetch_wheels({pins[layer].filename: payload})
    layers = {layer: [pin] for layer, pin in pins.items()}
    folder = contexts.build_context(layers)
    (folder / "common" / "sub").mkdir()
    refs = images.refs(layers, "linux/amd64")
    handed: list[tuple[str, str]] = []
    try:
        with pytest.raises(ValueError, match="sub is not a regular file"):
            images.serve(engine, folder, layers, "linux/amd64", lambda line: None,
                         on_served=lambda ref, image_id: handed.append((ref, image_id)))
        image = engine.image(refs["wheels-tools"])
        assert image is not None and handed == [(refs["wheels-tools"], image.id)]
        assert engine.image(refs["wheels-common"]) is None
    finally:
        for ref in refs.values():
            engine.remove_image(ref)
