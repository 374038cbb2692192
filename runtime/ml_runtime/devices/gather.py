"""Where the probe's facts come from, and what each costs.

Importing torch takes seconds (3.5-4.4 s on an H200 host), and the user's command imports it again,
so the probe asks torch only for what nothing else tells:

* torch's build (version, CUDA or ROCm release, compiled distributed backends): the record the image
  build wrote (:func:`~ml_runtime.devices.isolated.recorded_torch_facts`);
* the devices, from the host: none without an accelerator device node; NVIDIA's from NVML
  (:mod:`ml_runtime.devices.nvml`), AMD's from the KFD topology (:mod:`ml_runtime.devices.kfd`),
  numbered as torch will number them;
* torch itself, in a child process (:func:`~ml_runtime.devices.isolated.gather_torch_facts_isolated`),
  only when the spec asks what only torch can tell (a measured bandwidth), ``RUNTIME_PROBE=torch``,
  no record, or a host whose devices only torch can list (Intel's Level Zero decides them by its
  device hierarchy; a GPU in MIG mode; NVML not installed). :attr:`Gathered.torch_reason` says why,
  and the report prints it.

Example:
    >>> from ml_runtime.devices.facts import TorchFacts
    >>> cu130 = TorchFacts(torch_version="2.14.1", cuda_version="13.0")
    >>> with_devices(cu130, "cuda", []).accelerator_type is None
    True
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

from ml_runtime.devices import kfd, nvml
from ml_runtime.devices.facts import DeviceFacts, TorchFacts, gather_torch_facts, metadata_torch_facts
from ml_runtime.devices.host import accelerator_nodes, host_root
from ml_runtime.devices.isolated import (
    PROBE_ENV,
    RECORD_NAME,
    gather_torch_facts_isolated,
    recorded_torch_facts,
)
from ml_runtime.devices.records import record_file

#: What a start pays for importing torch, said with each reason (measured: 3.5-4.4 s on an H200).
TORCH_COST = "torch imported in a child process, a few seconds"

# (devices as torch will number them, the driver (version, source) when read with them); or None and why.
# (typing's spelling: the runtime supports Python 3.9, where a type alias cannot use X | None.)
Reading = tuple[Optional[list[DeviceFacts]], Optional[tuple[str, str]], Optional[str]]


@dataclass
class Gathered:
    """The facts, a driver already read with the devices, and where they came from.

    Example:
        >>> Gathered(TorchFacts(torch_version="2.13.0+cpu"), source="record").torch_reason is None
        True
    """

    facts: TorchFacts
    driver: tuple[str, str] | None = None
    source: str = "torch"  # record, record+nvml, record+kfd, metadata, torch
    torch_reason: str | None = None  # why torch was imported (None: it was not)


def with_devices(record: TorchFacts, kind: str, devices: list[DeviceFacts]) -> TorchFacts:
    """The recorded build facts with this host's devices of accelerator type ``kind``.

    Example:
        >>> from ml_runtime.devices.facts import DeviceFacts
        >>> f = with_devices(TorchFacts(torch_version="2.14.1", cuda_version="13.0"), "cuda",
        ...                  [DeviceFacts(0, "NVIDIA H200", major=9, minor=0)])
        >>> f.accelerator_type, f.cuda_available
        ('cuda', True)
    """
    found = bool(devices)
    return replace(record, devices=list(devices), accelerator_type=kind if found else None,
                   cuda_available=found and kind == "cuda", xpu_available=found and kind == "xpu")


def read_nvidia(environ: Mapping[str, str], load: Callable[[], Any] = nvml.load_pynvml) -> Reading:
    """NVIDIA's devices and driver from NVML (``load`` gives the pynvml module, or None).

    Example:
        >>> read_nvidia({}, load=lambda: None)
        (None, None, 'pynvml (nvidia-ml-py) is not installed')
    """
    module = load()
    if module is None:
        return None, None, "pynvml (nvidia-ml-py) is not installed"
    try:
        host = nvml.read_nvml(module)
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return None, None, f"NVML did not answer ({type(exc).__name__}: {exc})"
    devices, why = nvml.visible_gpus(host.gpus, environ)
    return devices, (host.driver_version, "nvml"), why


def read_amd(environ: Mapping[str, str], root: Path | None = None) -> Reading:
    """AMD's devices from the KFD topology under ``root`` (default :func:`host_root`; the driver is read
    with the host's facts).

    Example:
        >>> read_amd({}, Path("/nonexistent"))
        ([], None, None)
    """
    devices, why = kfd.visible_gpus(kfd.read_kfd(host_root(environ) if root is None else root), environ)
    return devices, None, why


# Per build: the accelerator type torch reports, the device nodes through which it could see one,
# the host reader (None: only torch can list them), and the reader's name (or why there is none).
_READERS: dict[str, tuple[str, tuple[str, ...], Callable[[Mapping[str, str]], Reading] | None, str]] = {
    "rocm": ("cuda", ("/dev/kfd",), read_amd, "kfd"),
    "cuda": ("cuda", ("/dev/nvidia", "/dev/dxg"), read_nvidia, "nvml"),
    "xpu": ("xpu", ("/dev/dri/", "/dev/dxg"), None,
            "Intel GPUs are listed by torch (Level Zero's device hierarchy decides what it shows)"),
}


def _build(record: TorchFacts) -> str:
    if record.hip_version:
        return "rocm"
    return "cuda" if record.cuda_version else "xpu" if record.xpu_build else "cpu"


def _torch(isolated: bool, measure_bandwidth: bool, why: str) -> Gathered:
    if isolated:
        facts = gather_torch_facts_isolated(measure_bandwidth)
    else:
        facts = gather_torch_facts(measure_bandwidth)
    return Gathered(facts, source="torch", torch_reason=f"{why}: {TORCH_COST}")


def gather_facts(
    isolated: bool = False,
    measure_bandwidth: bool = False,
    versions_only: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Gathered:
    """The facts at the least cost that still tells the truth (see the module's list).

    ``isolated`` asks torch, when it must, in a child process (before ``exec``);
    ``versions_only``: without a record, torch's version from its metadata is enough.

    Example:
        >>> gather_facts(versions_only=True, environ={"RUNTIME_RECORD_DIR": "/nonexistent"}).source
        'metadata'
    """
    env = os.environ if environ is None else environ
    if measure_bandwidth:
        return _torch(isolated, True, "the spec's memory_bandwidth_gbps is measured on the devices")
    if env.get(PROBE_ENV) == "torch":
        return _torch(isolated, False, f"{PROBE_ENV}=torch")
    record = recorded_torch_facts(environ=env)
    if record is None:
        if versions_only:
            return Gathered(metadata_torch_facts(), source="metadata")
        where = record_file(RECORD_NAME, env)
        return _torch(isolated, False, f"no build-time record of this torch's facts ({where})")
    build = _build(record)
    if build == "cpu":
        return Gathered(record, source="record")  # a CPU build sees no device anywhere
    kind, prefixes, reader, name = _READERS[build]
    if not any(node.startswith(prefixes) for node in accelerator_nodes(env)):
        return Gathered(record, source="record")  # no device node through which torch could see one
    if reader is None:
        return _torch(isolated, False, name)
    devices, driver, why = reader(env)
    if devices is None:
        return _torch(isolated, False, why or "the host's devices could not be read")
    return Gathered(with_devices(record, kind, devices), driver=driver, source=f"record+{name}")
