"""``builder smoke``: run each image and check it is what its target says.

Inside the container, through the image's own entrypoint (so the runtime contract runs
first): torch imports with the target's version and build flavour, UID 1001, /workspace,
PYTHONUNBUFFERED=1, a tensor operation, no wheel or installer cache left behind; then the
vendor-neutral training example with ``accelerate launch`` on 2 CPU processes (gloo).
When the host has the target vendor's GPUs, the container gets them and uses one;
otherwise the report says the device checks were skipped and why. Every container is
removed, pass or fail.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

from builder.project import Project, ResolvedTarget

SMOKE_LABEL = "io.ml-image-builder.smoke"
PROBE = (Path(__file__).parent / "smoke_probe.py").read_text()
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
    client: docker.DockerClient, image: str, command: list[str], *, timeout: int = 900, **kwargs: Any
) -> tuple[int, str]:
    """Run a container to completion; return (exit status, output). Always removes it."""
    container = client.containers.create(
        image, command, labels={SMOKE_LABEL: "1"}, network_mode="none", **kwargs
    )
    try:
        container.start()
        status = container.wait(timeout=timeout)["StatusCode"]
        return status, container.logs(stdout=True, stderr=True).decode(errors="replace")
    finally:
        container.remove(force=True)


def device_options(target: ResolvedTarget) -> tuple[dict[str, Any], str | None]:
    """docker-py options giving the container this target's GPUs, or (None, why not)."""
    if target.vendor == "cpu":
        return {}, "cpu target: no device to test"
    from builder import hostdetect
    from builder.launch import device_flags

    host = hostdetect.detect()
    if target.vendor not in host.usable():
        found = host.describe(target.vendor) or "none on the PCI bus"
        lack = "; ".join(host.missing(target.vendor)) if host.describe(target.vendor) else ""
        return {}, f"this host has no usable {target.vendor} GPU ({found}{'; ' + lack if lack else ''})"
    flags = device_flags(target, host)
    if flags.problems:
        return {}, "; ".join(flags.problems)
    return {k: v for k, v in flags.docker_kwargs().items() if v is not None}, None


def expected_flavour(target: ResolvedTarget, facts: dict[str, Any]) -> tuple[bool, str]:
    """Does torch's build match the target's backend and accelerator version?"""
    found = f"torch {facts.get('torch')} cuda={facts.get('cuda')} hip={facts.get('hip')} xpu={facts.get('xpu')}"
    if target.backend == "cuda":
        ok = facts.get("cuda") == target.accelerator_version and not facts.get("hip")
    elif target.backend == "rocm":
        ok = str(facts.get("hip") or "").startswith(str(target.accelerator_version)) and facts.get("cuda") is None
    elif target.backend == "xpu":
        ok = bool(facts.get("xpu")) and str(facts.get("torch", "")).endswith("+xpu")
    else:
        ok = str(facts.get("torch", "")).endswith("+cpu") and facts.get("cuda") is None and not facts.get("hip")
    return ok, found


def smoke_test(
    client: docker.DockerClient,
    project: Project,
    target: ResolvedTarget,
    image: str,
    *,
    train: bool = True,
    log: Callable[[str], None] = lambda s: None,
) -> SmokeResult:
    """Run the checks against *image* (an ID or a reference)."""
    result = SmokeResult()
    options, why_not = device_options(target)
    if why_not:
        result.skipped.append(f"device checks skipped: {why_not}")
        log(result.skipped[-1])
    status, out = run_container(
        client, image, ["python", "-c", PROBE, "device" if options else "none"], **options
    )
    facts = _last_json(out)
    if status != 0 or facts is None:
        result.add("container", False, f"exit {status}: {out.strip()[-400:]}")
        return result
    result.add("torch import", "error" not in facts, facts.get("error", "ok"))
    result.add("torch version", facts.get("torch") == target.torch_pin,
               f"{facts.get('torch')} (want {target.torch_pin})")
    result.add("build flavour", *expected_flavour(target, facts))
    result.add("user", facts.get("uid") == 1001 and facts.get("gid") == 1001, f"uid {facts.get('uid')}")
    result.add("workdir", facts.get("cwd") == "/workspace", str(facts.get("cwd")))
    result.add("PYTHONUNBUFFERED", facts.get("unbuffered") == "1", str(facts.get("unbuffered")))
    result.add("tensor op", facts.get("matmul") == 83.0, str(facts.get("matmul")))
    result.add("torch.distributed", facts.get("distributed") is True, str(facts.get("distributed")))
    result.add("no wheels or caches left", not facts.get("wheel_files") and not facts.get("caches"),
               ", ".join(facts.get("wheel_files", []) + facts.get("caches", [])) or "none")
    if options:
        result.add("device", facts.get("device") is not None and facts.get("device_matmul") == 83.0,
                   f"{facts.get('device')} matmul={facts.get('device_matmul')}")
    if train:
        status, out = run_container(client, image, TRAIN, shm_size="1g", environment=TRAIN_ENV)
        m = FINAL.search(out)
        ok = status == 0 and m is not None and float(m[2]) < float(m[1]) and "processes=2" in out
        detail = f"first {m[1]} -> last {m[2]}" if m else f"exit {status}: {out.strip()[-300:]}"
        result.add("accelerate 2-process training", ok, detail)
    for name, ok, detail in result.checks:
        log(f"[{'OK' if ok else 'FAIL'}] {name}: {detail}")
    return result


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None
