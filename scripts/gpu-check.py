#!/usr/bin/env python3
"""``make gpu-check``: the in-image runtime on a real GPU host, without Docker.

Runs the runtime from this checkout (``runtime/`` on ``PYTHONPATH``) with the host's own
torch, the way the images run it, and writes one JSON report (``--out``): every check with
``ok`` and a detail, plus the raw outputs that unit tests replay
(``tests/runtime/fixtures/recorded/``). Checks:

- ``probe --json --self-test``, ``metrics --json`` and ``get_gpu_metrics()`` name the GPU with
  non-empty fields;
- the design notes' spec demanding sm_80 (with their bandwidth and driver demands) passes on
  an sm_80-or-newer GPU, and a spec demanding gfx90a exits 3 without running the command;
- the notes' accelerator-config.yaml chooses priority 1;
- ``get_device()`` is ``cuda``; the copy bandwidth is measured;
- one Accelerate training run of ``examples/train.py`` (2 epochs) on the GPU.

Exit 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NOTES = ROOT / "tests" / "fixtures" / "notes"
ENV = {**os.environ, "PYTHONPATH": f"{ROOT / 'runtime'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
       "PYTHONUNBUFFERED": "1"}
RUNTIME = [sys.executable, "-m", "ml_runtime"]


def run(argv: list[str], timeout: int = 600) -> dict[str, Any]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"argv": argv, "exit": None, "stdout": "", "stderr": f"{type(exc).__name__}: {exc}"}
    return {"argv": argv[len(RUNTIME) - 1:] if argv[:3] == RUNTIME else argv, "exit": proc.returncode,
            "stdout": proc.stdout[-20000:], "stderr": proc.stderr[-6000:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "gpu-check.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "runtime"))
    from ml_runtime import get_device, get_gpu_metrics
    from ml_runtime.devices.facts import gather_torch_facts

    checks: dict[str, dict[str, Any]] = {}
    raw: dict[str, Any] = {}

    def check(name: str, ok: bool, detail: str) -> None:
        checks[name] = {"ok": bool(ok), "detail": detail}
        print(f"[{'OK' if ok else 'FAIL'}] {name}: {detail}", flush=True)

    raw["torch_facts"] = gather_torch_facts(measure_bandwidth=True).to_dict()
    query = "--query-gpu=index,name,utilization.gpu,temperature.gpu,memory.used,memory.total"
    raw["nvidia_smi_query"] = run(["nvidia-smi", query, "--format=csv"])["stdout"]
    raw["nvidia_smi_identity"] = run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version",
                                      "--format=csv"])["stdout"]

    probe_run = run([*RUNTIME, "probe", "--json", "--self-test"])
    raw["probe"] = probe = json.loads(probe_run["stdout"]) if probe_run["exit"] == 0 else {}
    devices = probe.get("devices", [])
    check("probe", bool(devices) and all(d.get("name") and d.get("compute_capability") for d in devices)
          and probe.get("torch", {}).get("flavour", "").startswith("cuda"),
          f"{probe.get('vendor')} {probe.get('torch', {}).get('flavour')}: "
          + ", ".join(f"{d.get('name')} {d.get('compute_capability')}" for d in devices))
    compute = probe.get("self_test", {}).get("compute", {})
    check("self-test tensor op on the GPU", compute.get("cuda", {}).get("ok") is True, json.dumps(compute))

    metrics_run = run([*RUNTIME, "metrics", "--json"])
    raw["metrics"] = metrics = json.loads(metrics_run["stdout"]) if metrics_run["exit"] == 0 else {}
    fields = ("utilization_pct", "temperature_c", "memory_used_mib", "memory_total_mib", "model")
    check("metrics", bool(metrics.get("devices")) and all(d.get(f) is not None for d in metrics["devices"]
                                                          for f in fields),
          json.dumps(metrics.get("devices"))[:300])
    raw["get_gpu_metrics"] = helper = get_gpu_metrics()
    check("get_gpu_metrics()", bool(helper) and all(v is not None for d in helper for v in d.values()),
          json.dumps(helper)[:300])
    device = get_device()
    check("get_device()", device.type == "cuda", str(device))

    bandwidth = [d.get("bandwidth_gbps") for d in raw["torch_facts"].get("devices", [])]
    check("bandwidth measured", bool(bandwidth) and all(b and b > 0 for b in bandwidth), f"{bandwidth} GB/s")

    sm80 = run([*RUNTIME, "exec", "--spec", str(NOTES / "runtime-spec-gpu.yaml"), "--", "echo", "COMMAND RAN"])
    raw["spec_sm80"] = sm80
    check("notes' spec (sm_80, 2000 GB/s, driver 535.54.03) passes", sm80["exit"] == 0
          and "COMMAND RAN" in sm80["stdout"], sm80["stderr"].strip().replace("\n", " | ")[-600:])
    gfx = run([*RUNTIME, "exec", "--spec", str(NOTES / "runtime-spec-gfx90a.yaml"), "--", "echo", "COMMAND RAN"])
    raw["spec_gfx90a"] = gfx
    check("gfx90a spec exits 3 before the command", gfx["exit"] == 3 and "COMMAND RAN" not in gfx["stdout"],
          gfx["stderr"].strip().replace("\n", " | ")[-400:])
    checker_code = "import sys; from ml_runtime.cli import checker_main; sys.exit(checker_main(sys.argv[1:]))"
    checker = run([sys.executable, "-c", checker_code, "--config", str(NOTES / "runtime-spec-gpu.yaml")])
    raw["runtime_checker"] = checker
    check("runtime-checker (notes' format)", checker["exit"] == 0 and "[SUCCESS]" in checker["stdout"],
          checker["stdout"].strip().replace("\n", " | ")[-600:])

    select = run([*RUNTIME, "select", "--config", str(NOTES / "accelerator-config.yaml"), "--json"])
    raw["select"] = chosen = json.loads(select["stdout"]) if select["stdout"].strip().startswith("{") else {}
    check("notes' accelerator-config chooses priority 1", chosen.get("priority") == 1 and bool(chosen.get("devices")),
          json.dumps({k: chosen.get(k) for k in ("priority", "env", "problems", "warnings")}))

    train = run([sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
                 "--mixed_precision", "no", "--dynamo_backend", "no", "examples/train.py", "--epochs", "2"])
    raw["train"] = train
    check("accelerate training on the GPU", train["exit"] == 0 and "device=cuda" in train["stdout"]
          and "FINAL" in train["stdout"], (train["stdout"] + train["stderr"]).strip()[-300:])

    report = {"date": datetime.date.today().isoformat(), "python": sys.version.split()[0],
              "ok": all(c["ok"] for c in checks.values()), "checks": checks, "raw": raw}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"report: {args.out} ({sum(c['ok'] for c in checks.values())}/{len(checks)} checks passed)")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
