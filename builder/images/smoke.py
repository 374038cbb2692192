"""``builder smoke``: run each image and check it is what its target says.

Inside the container, through the image's own entrypoint (tini, then the runtime contract):
the runtime's own probe, ``runtime-check probe --json --self-test``, reports torch's public
version and build flavour (from ``torch.version.cuda/hip/xpu``), the process (UID 1001,
/workspace, PYTHONUNBUFFERED=1, tini as PID 1) and a tensor operation with a known answer;
a second container looks for wheels or installer caches left behind; then the vendor-neutral
training example runs with ``accelerate launch`` on 2 CPU processes (gloo). When the host
has the target vendor's GPUs, the probe container gets them and computes on one; otherwise
the report says the device checks were skipped and why. A foreign platform's image runs under
qemu emulation: the probe and the leftovers check run, the training and the device checks are
skipped and the report says so. Every container is removed, pass or fail; one that a killed run
left (its label names a run whose lease is free: :func:`builder.config.ownership.run_token`) is
removed by the next build (:func:`builder.images.execute.remove_orphans`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from packaging.version import InvalidVersion, Version

from builder.config import platforms
from builder.config.errors import TargetFailed
from builder.config.ownership import run_token
from builder.config.project import Project, Target, TargetView
from builder.host.devices import device_options
from builder.oci.engine import ContainerTimeout, Engine

#: On every smoke container: its run, this process's lease (:func:`builder.config.ownership.run_token`).
SMOKE_LABEL = "io.ml-image-builder.images.smoke"
PROBE = ["runtime-check", "probe", "--json", "--self-test"]
#: Where a wheel or an installer cache could be left behind (the base's own Debian wheels aside).
LEFTOVERS = ["/opt", "/usr/lib/python3", "/root", "/tmp", "/home", "/workspace", "-xdev", "(", "-name", "*.whl",
             "-o", "-path", "*/.cache/pip", "-o", "-path", "*/.cache/uv", "-o", "-path", "/tmp/uv", ")", "-print"]
# accelerate's --cpu launcher starts ONE process (several only with an MPI hostfile); the
# multi-process launcher with ACCELERATE_USE_CPU=true starts 2 CPU processes on gloo.
TRAIN = [
    "accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
    "--mixed_precision", "no", "--dynamo_backend", "no", "/opt/examples/train.py",
]
TRAIN_ENV = {"ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
FINAL = re.compile(r"FINAL first_loss=([0-9.eE+-]+) last_loss=([0-9.eE+-]+)")


@dataclass
class SmokeResult:
    """Checks that ran, with their outcome; ``status`` is passed, failed or skipped."""

    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        if not self.checks:
            return "skipped"
        return "passed" if all(ok for _, ok, _ in self.checks) else "failed"

    def add(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append((name, ok, detail))

    def summary(self) -> str:
        bad = [f"{n}: {d}" for n, ok, d in self.checks if not ok]
        return "; ".join(bad) if bad else "all checks passed"


def run_container(
    engine: Engine, image: str, command: list[str], *, timeout: int = 900, **options: Any
) -> tuple[int, str, str]:
    """Run a smoke container to completion, without a network; return (exit status, stdout and stderr
    merged, stdout). The engine always removes it.

    Parse stdout only: a warning on stderr can land inside the lines of a JSON document.

    The label's value is this run's lease (:func:`builder.config.ownership.run_token`): an interrupted
    ``builder build`` removes its own, the next build those of a killed one.
    A container still running after *timeout* seconds fails the target (TargetFailed).
    """
    try:
        return engine.run(image, command, labels={SMOKE_LABEL: run_token()}, timeout=timeout, network_mode="none",
                          **options)
    except ContainerTimeout:
        shown = " ".join(command)[:80]
        ref = image.removeprefix("sha256:")[:12] if image.startswith("sha256:") else image
        raise TargetFailed(
            f"smoke container '{shown}' still running after the {timeout} s timeout (removed); "
            f"run it by hand to see where it hangs: docker run --rm -it {ref} {shown}"
        ) from None


def public_version(version: object) -> str | None:
    """A version without its local label (``2.14.1+cu130`` -> ``2.14.1``); None if unparsable."""
    try:
        return Version(str(version)).public
    except InvalidVersion:
        return None


def smoke_test(
    engine: Engine,
    project: Project,
    view: TargetView,
    image: str,
    *,
    train: bool = True,
    log: Callable[[str], None] = lambda s: None,
) -> SmokeResult:
    """Run the checks against *image* (an ID or a reference) of the target view's platform."""
    result = SmokeResult()
    emulated = None if view.native else f"{view.platform} runs under qemu emulation on this " \
                                          f"{platforms.host_platform()} host"
    options, why_not = ({}, emulated) if emulated else device_options(view, engine.name(), engine.info)
    if why_not:
        result.skipped.append(f"device checks skipped: {why_not}")
        log(result.skipped[-1])
    # Under qemu the host's CPU topology in /sys crashes the foreign torch's oneDNN CPU detection
    # at import (x86 caches read by aarch64 code): an empty, read-only /sys/devices/system/cpu hides
    # it. The environment fits the container to qemu (platforms.emulated_env says why).
    masked: dict[str, Any] = {"tmpfs": {"/sys/devices/system/cpu": "ro"},
                              "environment": platforms.emulated_env(view.platform)} if emulated else {}
    status, out, stdout = run_container(engine, image, PROBE, **options, **masked)
    probe = _json_after_checks(stdout)
    if status != 0 or probe is None:
        result.add("container", False, f"exit {status}: {out.strip()[-400:]}")
        return result
    result.checks += _probe_checks(probe, view)
    result.add("no wheels or caches left", *_leftovers(engine, image))
    if options:
        result.add("device", *_device_check(probe))
    if train and emulated:
        result.skipped.append(f"accelerate 2-process training skipped: {emulated} (minutes per step)")
        log(result.skipped[-1])
    elif train:
        result.add("accelerate 2-process training", *_train(engine, image))
    for name, ok, detail in result.checks:
        log(f"[{'OK' if ok else 'FAIL'}] {name}: {detail}")
    return result


def _probe_checks(probe: dict[str, Any], target: Target) -> list[tuple[str, bool, str]]:
    """The checks of the probe's report: torch (import, version, flavour), the process, a tensor op on the
    CPU, torch.distributed."""
    torch_info = probe.get("torch", {})
    selftest = probe.get("self_test", {})
    process, cpu = selftest.get("process", {}), selftest.get("compute", {}).get("cpu", {})
    found = public_version(torch_info.get("version"))
    want = target.flavour
    flavour = str(torch_info.get("flavour"))
    distributed = probe.get("distributed", {})
    return [
        ("torch import", not torch_info.get("import_error"), torch_info.get("import_error") or "ok"),
        ("torch version", found is not None and found == public_version(target.torch_pin),
         f"{torch_info.get('version')} (want {public_version(target.torch_pin)})"),
        ("build flavour", flavour == want or (target.backend == "rocm" and flavour.startswith(want + ".")),
         f"{flavour} (want {want}; cuda={torch_info.get('cuda')} hip={torch_info.get('hip')})"),
        ("init as PID 1", process.get("pid1") == "tini", str(process.get("pid1"))),
        ("user", process.get("uid") == 1001 and process.get("gid") == 1001, f"uid {process.get('uid')}"),
        ("writable HOME", process.get("home_writable") is True, str(process.get("home"))),
        ("workdir", process.get("cwd") == "/workspace", str(process.get("cwd"))),
        ("PYTHONUNBUFFERED", process.get("unbuffered") == "1", str(process.get("unbuffered"))),
        ("tensor op", cpu.get("ok") is True, str(cpu.get("value", cpu.get("error")))),
        ("torch.distributed", distributed.get("available") is True,
         f"{distributed.get('available')} ({distributed.get('backend')})"),
    ]


def _device_check(probe: dict[str, Any]) -> tuple[bool, str]:
    """The probe's computation on the GPU it was given."""
    compute = probe.get("self_test", {}).get("compute", {})
    device = next((d for d in compute if d != "cpu"), None)
    check = compute.get(device or "", {})
    return check.get("ok") is True, f"{device}: {check.get('value', check.get('error'))}"


def _leftovers(engine: Engine, image: str) -> tuple[bool, str]:
    """Whether the image holds no wheel or installer cache, and those found (the first 5)."""
    status, out, found = run_container(engine, image, LEFTOVERS, entrypoint=["/usr/bin/find"], user="0:0")  # root sees /root
    left = found.split()
    return (status == 0 and not left,
            ", ".join(left[:5]) or "none" if status == 0 else f"find exited {status}: {out[-200:]}")


def _train(engine: Engine, image: str) -> tuple[bool, str]:
    """accelerate's 2-process training on the CPU: whether the loss fell, and the losses (or the failure)."""
    status, out, _ = run_container(engine, image, TRAIN, shm_size="1g", environment=TRAIN_ENV)
    m = FINAL.search(out)
    ok = status == 0 and m is not None and float(m[2]) < float(m[1]) and "processes=2" in out
    detail = f"first {m[1]} -> last {m[2]}" if m else f"exit {status}: {out.strip()[-300:]}"
    return ok, detail


def _json_after_checks(text: str) -> dict[str, Any] | None:
    """The JSON object printed after the contract's ``[CHECK]`` lines, or None.

    Example:
        >>> _json_after_checks('[CHECK] pytorch: 2.13.0+cpu -> OK\\n{\\n  "vendor": "none"\\n}\\n')
        {'vendor': 'none'}
    """
    for start in re.finditer(r"^\{", text, re.MULTILINE):
        try:
            value, _ = json.JSONDecoder().raw_decode(text[start.start():])
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None
