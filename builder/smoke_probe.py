"""Runs INSIDE an image during the smoke test (standard library and torch only).

Prints one JSON object of facts; the host compares them with the target. Argument 1 is
"device" when the container was given the target's GPUs.
"""

import json
import os
import sys

facts = {"uid": os.getuid(), "gid": os.getgid(), "cwd": os.getcwd(),
         "unbuffered": os.environ.get("PYTHONUNBUFFERED")}
try:
    import torch

    facts.update(torch=torch.__version__, cuda=torch.version.cuda, hip=getattr(torch.version, "hip", None),
                 xpu=hasattr(torch, "xpu"), distributed=torch.distributed.is_available())
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    facts["matmul"] = float((a @ a.T).sum())
    if len(sys.argv) > 1 and sys.argv[1] == "device":
        acc = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        facts["device"] = str(acc) if acc is not None else None
        if acc is not None:
            d = a.to(acc)
            facts["device_matmul"] = float((d @ d.T).sum().cpu())
except Exception as exc:  # noqa: BLE001 - report, the host decides
    facts["error"] = f"{type(exc).__name__}: {exc}"
wheels = []
for top in ("/opt", "/usr/lib/python3", "/root", "/tmp", "/home", "/workspace"):
    for dirpath, _, files in os.walk(top):
        wheels += [os.path.join(dirpath, f) for f in files if f.endswith(".whl")]
facts["wheel_files"] = wheels[:5]
facts["caches"] = [p for p in ("/root/.cache/pip", "/root/.cache/uv", "/tmp/uv") if os.path.exists(p)]
print(json.dumps(facts))
