"""The image's default spec, validated once at image build: a container start reads the record.

``python -m ml_runtime.contract.record FILE`` (the image build, beside the torch facts record of
:mod:`ml_runtime.devices.isolated`) validates the packaged ``default-spec.yaml`` with the pydantic
models and writes the result, keyed to that file's bytes and to the validators' sources. A start
that resolves to the packaged spec reads the record when the key still matches (hashing two
small files costs far less than importing pydantic and PyYAML); when it does not (an edited or
replaced file, another runtime, no record at all) the spec is validated in full, as every other
spec always is.

Example:
    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp()) / "default-spec.json"
    >>> record_spec(out).mode
    'strict'
    >>> recorded_spec("default", out).dependencies[0].range_text
    '>=2.0'
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from ml_runtime.contract.fields import load_yaml_mapping
from ml_runtime.contract.spec import DEFAULT_SPEC_PATH, Dependency, DriverRequirement, Spec
from ml_runtime.devices.capability import Capability, parse_capability
from ml_runtime.devices.records import record_file
from ml_runtime.errors import ConfigError

#: Written at image build, in the same step that installs the runtime (:mod:`ml_runtime.devices.records`).
RECORD_NAME = "default-spec.json"

#: What the record is keyed to besides the spec: the modules that validate it.
_VALIDATORS = ("schema.py", "spec_file.py")


def spec_key(spec_path: Path = DEFAULT_SPEC_PATH) -> str | None:
    """sha256 of the spec file's bytes and of the validators' sources (None if one is unreadable).

    Example:
        >>> len(spec_key())
        64
    """
    digest = hashlib.sha256()
    try:
        for path in (spec_path, *(Path(__file__).with_name(name) for name in _VALIDATORS)):
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    except OSError:
        return None
    return digest.hexdigest()


def record_spec(path: Path | None = None) -> Spec:
    """Validate the packaged default spec (ConfigError if it is wrong) and write the record to ``path``.

    The JSON is byte-stable (sorted keys), so the layer holding it stays reproducible.

    Example:
        >>> import tempfile
        >>> record_spec(Path(tempfile.mkdtemp()) / "spec.json").dependencies[0].name
        'pytorch'
    """
    # Here, not at the top: every start imports this module; pydantic (~0.2 s) is for the image build.
    from ml_runtime.contract.spec_file import parse_spec

    label = str(DEFAULT_SPEC_PATH)
    spec = parse_spec(load_yaml_mapping(DEFAULT_SPEC_PATH, label), label)
    document = {"spec_key": spec_key(), "spec": _to_data(spec)}
    path = record_file(RECORD_NAME) if path is None else path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, sort_keys=True, indent=1) + "\n", encoding="utf-8")
    return spec


def recorded_spec(source: str, path: Path | None = None) -> Spec | None:
    """The recorded default spec when its key matches the installed files, else None.

    Example:
        >>> recorded_spec("default", Path("/nonexistent.json")) is None
        True
    """
    try:
        stored = record_file(RECORD_NAME) if path is None else path
        document = json.loads(stored.read_text(encoding="utf-8"))
        if document["spec_key"] is None or document["spec_key"] != spec_key():
            return None
        return _from_data(document["spec"], source)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # no record (a host install), or a damaged one: validate the file


def _to_data(spec: Spec) -> dict[str, Any]:
    features: dict[str, Any] = {}
    for key, value in spec.features.items():
        if isinstance(value, Capability):
            value = value.text
        elif isinstance(value, DriverRequirement):
            value = {vendor or "": version for vendor, version in value.minimums.items()}
        features[key] = value
    dependencies = [
        {"name": d.name, "version_range": d.range_text, "full_distribution": d.full_distribution,
         "vendor_agnostic_wheel": d.vendor_agnostic_wheel, "host_driver": d.host_driver, "path": d.path}
        for d in spec.dependencies
    ]
    return {"features": list(features.items()), "dependencies": dependencies, "mode": spec.mode}


def _from_data(data: dict[str, Any], source: str) -> Spec:
    features: dict[str, Any] = {}
    for key, value in data["features"]:
        if key == "gpu_compute_capability":
            value = parse_capability(value)
        elif key == "driver_version_min":
            value = DriverRequirement({vendor or None: version for vendor, version in value.items()})
        features[key] = value
    dependencies = tuple(
        Dependency.of(
            d["name"], d["version_range"], d["full_distribution"], d["vendor_agnostic_wheel"], d["path"],
            d["host_driver"],
        )
        for d in data["dependencies"]
    )
    return Spec(source=source, features=features, dependencies=dependencies, mode=data["mode"])


def main(argv: list[str] | None = None) -> int:
    """``python -m ml_runtime.contract.record FILE``: validate the default spec, write its record.

    Example:
        >>> main([])
        2
    """
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m ml_runtime.contract.record FILE", file=sys.stderr)  # stderr: not in a doctest
        return 2
    try:
        record_spec(Path(args[0]))
    except ConfigError as exc:
        print(f"the image's default spec is invalid: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
