"""Which ``runtime-spec.yaml`` is used, and reading it into a :class:`~ml_runtime.contract.spec.Spec`.

Which file is used (the first found wins as a whole; files are not merged):

1. ``--spec PATH`` (``runtime-checker --config PATH``)
2. the path in ``$RUNTIME_SPEC``
3. ``runtime_contract`` in accelerator-config.yaml (relative to that file)
4. ``/workspace/runtime-spec.yaml`` (the directory can be moved with
   ``$RUNTIME_WORKSPACE``)
5. the packaged ``default-spec.yaml``

The packaged one, unchanged, is read from its build-time record (:mod:`ml_runtime.contract.record`);
any other file is validated in full (:func:`~ml_runtime.contract.spec_file.parse_spec`).

Example:
    >>> spec = load_spec(environ={"RUNTIME_WORKSPACE": "/nonexistent"})
    >>> spec.source == str(DEFAULT_SPEC_PATH), spec.mode
    (True, 'strict')
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ml_runtime.contract.fields import load_yaml_mapping, workspace_dir
from ml_runtime.contract.record import recorded_spec
from ml_runtime.contract.spec import DEFAULT_SPEC_PATH, Spec
from ml_runtime.errors import ConfigError

SPEC_FILENAME = "runtime-spec.yaml"


def resolve_spec_path(
    cli_path: str | None, environ: Mapping[str, str] | None = None, contract: Path | None = None
) -> tuple[Path, str]:
    """(path, label) of the spec to use, following the documented precedence.

    ``contract`` is accelerator-config.yaml's ``runtime_contract``, already resolved.

    Example:
        >>> resolve_spec_path(None, {"RUNTIME_WORKSPACE": "/nonexistent"})[0] == DEFAULT_SPEC_PATH
        True
    """
    env = os.environ if environ is None else environ
    if cli_path:
        path = Path(cli_path)
        if not path.is_file():
            raise ConfigError(f"{cli_path}: spec file not found (from --spec)")
        return path, cli_path
    env_path = env.get("RUNTIME_SPEC")
    if env_path:
        if not Path(env_path).is_file():
            raise ConfigError(f"{env_path}: spec file not found (from RUNTIME_SPEC)")
        return Path(env_path), env_path
    if contract is not None:
        if not contract.is_file():
            raise ConfigError(
                f"{contract}: spec file not found (from runtime_contract in accelerator-config.yaml)"
            )
        return contract, str(contract)
    candidate = workspace_dir(env) / SPEC_FILENAME
    if candidate.is_file():
        return candidate, str(candidate)
    return DEFAULT_SPEC_PATH, str(DEFAULT_SPEC_PATH)


def load_spec(
    cli_path: str | None = None, environ: Mapping[str, str] | None = None, contract: Path | None = None
) -> Spec:
    """Locate, read and validate the spec.

    Example:
        >>> load_spec(environ={"RUNTIME_WORKSPACE": "/nonexistent"}).dependencies[0].name
        'pytorch'
    """
    path, label = resolve_spec_path(cli_path, environ, contract)
    if path == DEFAULT_SPEC_PATH:  # validated at image build, unless it changed since
        recorded = recorded_spec(label)
        if recorded is not None:
            return recorded
    # Here, not at the top: pydantic (~0.2 s) is imported only when a file is validated.
    from ml_runtime.contract.spec_file import parse_spec

    return parse_spec(load_yaml_mapping(path, label), label)
