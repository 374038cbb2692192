"""torch's facts without importing torch in this process: from the build-time record, or a child Python.

What torch says of its own build (version, CUDA/ROCm release, compiled distributed backends) does
not change after the image is built: the image build records it once
(:func:`~ml_runtime.devices.facts.record_torch_facts`, where no accelerator is visible) and a start
reads it (:func:`recorded_torch_facts`) for as long as the installed torch is the one recorded. The
devices come from the host (:mod:`ml_runtime.devices.gather`). When only torch can tell (a measured
bandwidth, no record), :func:`gather_torch_facts_isolated` asks a child (``python -m
ml_runtime.devices.facts``) within :func:`probe_timeout` seconds: ``runtime-check exec`` replaces
itself with the user's command, so it never initialises an accelerator itself.

Example:
    >>> recorded_torch_facts(Path("/nonexistent.json")) is None
    True
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from ml_runtime.devices.facts import FACTS_MARKER, TorchFacts, ccl_bindings_installed, torch_install_key
from ml_runtime.devices.records import record_file

#: How long the isolated probe may take (a wedged GPU driver must not stall every container
#: start); ``RUNTIME_PROBE_TIMEOUT`` (seconds) overrides it.
ISOLATED_TIMEOUT_S = 10.0

TIMEOUT_ENV = "RUNTIME_PROBE_TIMEOUT"


#: What torch says of its build, written once at image build (``python -m ml_runtime.devices.facts
#: --record FILE``, in the layer that installs torch; importing torch takes seconds). A container
#: start reads it instead of importing torch, for as long as the installed torch is the one recorded.
RECORD_NAME = "torch-facts.json"

#: ``RUNTIME_PROBE=torch`` ignores the record: torch is imported, the devices are torch's.
PROBE_ENV = "RUNTIME_PROBE"


def probe_timeout() -> float:
    """``$RUNTIME_PROBE_TIMEOUT`` seconds if a positive number, else :data:`ISOLATED_TIMEOUT_S`.

    Example:
        >>> probe_timeout() > 0
        True
    """
    try:
        value = float(os.environ.get(TIMEOUT_ENV, ""))
    except ValueError:
        return ISOLATED_TIMEOUT_S
    return value if value > 0 else ISOLATED_TIMEOUT_S


def recorded_torch_facts(
    path: Path | None = None, environ: Mapping[str, str] | None = None
) -> TorchFacts | None:
    """The recorded facts of torch's build when they hold here; None when torch must be asked.

    They hold when ``RUNTIME_PROBE`` is not ``torch`` and the installed torch is the one recorded.
    They name no device (none was visible at build). oneCCL's bindings may come in a layer above
    the record, so whether they are installed is looked up now.

    Example:
        >>> recorded_torch_facts(Path("/nonexistent.json")) is None
        True
    """
    env = os.environ if environ is None else environ
    if env.get(PROBE_ENV) == "torch":
        return None
    try:
        source = record_file(RECORD_NAME, env) if path is None else path
        document = json.loads(source.read_text(encoding="utf-8"))
        if document["torch_install"] is None or document["torch_install"] != torch_install_key():
            return None
        facts = TorchFacts.from_dict(document["facts"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no record (a host install, a foreign build), or a damaged one: ask torch
    if facts.distributed_available:
        facts.distributed_backends["ccl"] = ccl_bindings_installed()
    return facts


def gather_torch_facts_isolated(
    measure_bandwidth: bool = False, timeout: float | None = None
) -> TorchFacts:
    """:func:`~ml_runtime.devices.facts.gather_torch_facts` in a child Python; never raises.

    ``runtime-check exec`` replaces itself with the user's command, so it must
    not initialise an accelerator itself: a device context or open device file
    could outlive the exec and hold memory. The child exits after reporting.

    Example:
        >>> from ml_runtime.devices.facts import gather_torch_facts
        >>> gather_torch_facts_isolated(timeout=300).torch_version == gather_torch_facts().torch_version
        True
    """
    package_parent = str(Path(__file__).resolve().parents[2])  # the same ml_runtime, installed or copied
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-m", "ml_runtime.devices.facts", *(["--bandwidth"] if measure_bandwidth else [])]
    timeout = probe_timeout() if timeout is None else timeout
    try:
        proc = subprocess.run(
            argv,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return TorchFacts(
            torch_version=None,
            import_error=f"the torch/GPU probe timed out after {timeout:g} s (a wedged GPU driver?); "
            f"check the driver (nvidia-smi, rocm-smi), or wait longer with {TIMEOUT_ENV}=SECONDS",
        )
    except OSError as exc:
        return TorchFacts(
            torch_version=None, import_error=f"probe process failed: {type(exc).__name__}: {exc}"
        )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(FACTS_MARKER):
            try:
                return TorchFacts.from_dict(json.loads(line[len(FACTS_MARKER) :]))
            except (ValueError, TypeError) as exc:
                return TorchFacts(torch_version=None, import_error=f"probe process output unreadable: {exc}")
    detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return TorchFacts(
        torch_version=None, import_error=f"probe process failed (exit {proc.returncode}): {detail}"
    )
