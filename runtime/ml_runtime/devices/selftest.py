"""``runtime-check probe --self-test``: does this container really work, not just import?

Adds to the probe what a scheduler or a smoke test needs to trust the container: who it runs
as, where, whether ``HOME`` is writable, what PID 1 is (an init such as tini forwards
SIGTERM and reaps orphans), and one small matrix product on the CPU and on the accelerator
with a known answer.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: sum(A @ A.T) for A = arange(6).reshape(2, 3): a fixed answer that needs real arithmetic.
EXPECTED_SUM = 83.0


def process_facts() -> dict[str, Any]:
    """UID, GID, working directory, HOME and PID 1 of this container.

    Example:
        >>> import os
        >>> process_facts()["uid"] == os.getuid()
        True
    """
    home = os.environ.get("HOME", "")
    try:
        init = Path("/proc/1/comm").read_text().strip()
    except OSError:
        init = None
    return {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "cwd": os.getcwd(),
        "home": home,
        "home_writable": bool(home) and os.access(home, os.W_OK | os.X_OK),
        "pid1": init,
        "unbuffered": os.environ.get("PYTHONUNBUFFERED"),
    }


def compute_check(device: str) -> dict[str, Any]:
    """The fixed matrix product on ``device``: {"ok": bool, "value" or "error"}.

    Example:
        >>> compute_check("cpu")
        {'ok': True, 'value': 83.0}
    """
    try:
        import torch

        a = torch.arange(6, dtype=torch.float32, device=device).reshape(2, 3)
        value = float((a @ a.T).sum().cpu())
    except Exception as exc:  # reported: the caller decides
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"ok": value == EXPECTED_SUM, "value": value}


def self_test() -> dict[str, Any]:
    """Process facts, and the matrix product on the CPU and the current accelerator (if any).

    Example:
        >>> sorted(self_test())
        ['compute', 'process']
    """
    compute = {"cpu": compute_check("cpu")}
    try:
        import torch

        accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    except Exception:  # no torch, or one without torch.accelerator: CPU only
        accelerator = None
    if accelerator is not None:
        compute[str(accelerator)] = compute_check(str(accelerator))
    return {"process": process_facts(), "compute": compute}
