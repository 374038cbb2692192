"""The wheels' contexts as images of the engine's store, where its builds read those in place
(:meth:`~builder.oci.engine.Engine.serves_image_contexts`: Docker's own BuildKit on the containerd
store); elsewhere (podman, the classic store, another buildx builder) each layer's staged folder
is the context, as :mod:`builder.wheels.contexts` stages it.

Each layer's image holds that layer's staged files (:mod:`builder.oci.contextimages`), named by a key
of the platform, the layer and its wheels' locked hashes (:func:`refs`): the same wheels give the
same image on every machine and for every target that names them, a changed layer a new one
beside the old (``builder gc`` removes those no current lock names). An image is loaded once and then
read by every build, its early export included, in place: nothing is sent per build, and
``docker buildx prune`` leaves it. It is used only when its one layer is the digest the wheelhouse
ledger recorded when it was loaded from the checked folder; else it is loaded again.

Example:
    >>> refs({"torch": [pin]}, "linux/amd64")  # doctest: +SKIP
    {'wheels-torch': 'ml-image-builder.invalid/contexts/wheels-torch:3f1c...'}
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from builder.config.files import locked
from builder.oci import contextimages
from builder.oci.engine import Engine, EngineError
from builder.wheels import wheelhouse
from builder.wheels.layers import context_name
from builder.wheels.lockfile import Pin

#: How a build names a context that is an image (BuildKit's scheme for ``--build-context``).
SCHEME = "docker-image://"
#: The folder record's fact that keeps each layer's diff ID: {layer: "sha256:..."}.
DIFF_IDS = "diff_ids"


def key(layer: str, pins: Sequence[Pin], platform: str) -> str:
    """What identifies a layer's image: its platform, its name and its wheels' locked hashes."""
    wheels = sorted([p.filename, p.sha256] for p in pins)
    return hashlib.sha256(json.dumps([platform, layer, wheels]).encode()).hexdigest()


def refs(layers: Mapping[str, Sequence[Pin]], platform: str) -> dict[str, str]:
    """Each layer's context name and the name of its image (nothing is asked of an engine)."""
    return {context_name(layer): contextimages.ref(context_name(layer), key(layer, pins, platform))
            for layer, pins in layers.items()}


def serve(engine: Engine, folder: Path, layers: Mapping[str, Sequence[Pin]], platform: str,
          say: Callable[[str], object] = wheelhouse.say_stderr,
          on_served: Callable[[str, str], object] = lambda ref, image_id: None) -> dict[str, tuple[str, str]]:
    """The contexts of *layers* as images of *engine*: by context name, the image's name and ID. Each
    is checked against its recorded diff ID and loaded from the staged *folder*
    (:func:`builder.wheels.contexts.build_context`, held by this run) when absent or another;
    *say* gets a line for each image loaded, *on_served* each image's name and ID as soon as it is
    in place, before the next is loaded (the caller records it: a run stopped between two loads
    leaves none it did not record). Raises what the engine raises (:class:`EngineError` when it did
    not keep an image as loaded)."""
    record = wheelhouse.records(say).get(wheelhouse.context_key(folder))
    known: dict[str, str] = dict(record.facts.get(DIFF_IDS) or {}) if record is not None else {}
    served, learned = {}, {}
    for (layer, pins), (name, ref) in zip(layers.items(), refs(layers, platform).items(), strict=True):
        image = engine.image(ref)
        if image is not None and len(image.layers) == 1 and layer not in known:
            # loaded for another staged folder of the same wheels (another target): hashing is ~15x a load
            known[layer] = learned[layer] = contextimages.diff_id(folder / layer)
        if image is None or image.layers != (known.get(layer),):
            archive = contextimages.Archive(folder / layer, name, key(layer, pins, platform), platform)
            engine.load(archive)
            image = engine.image(ref)
            if image is None or image.layers != (archive.diff_id,):
                raise EngineError(f"the engine did not keep {ref} as loaded from {folder / layer}")
            learned[layer] = archive.diff_id
            say(f"wheels: {name} loaded into the image store as {ref} "
                f"({sum(p.stat().st_size for p in (folder / layer).iterdir()) / 1e6:.0f} MB)")
        served[name] = (ref, image.id)
        on_served(ref, image.id)
    if learned:
        with locked(wheelhouse.lock_path()), wheelhouse.editing(wheelhouse.location(), say) as book:
            if (record := book.get(wheelhouse.context_key(folder))) is not None:
                record.facts[DIFF_IDS] = {**record.facts.get(DIFF_IDS, {}), **learned}
    return served
