"""Device memory bandwidth from a short device-to-device copy.

The figure counts bytes read plus bytes written (2 x buffer size per copy),
the convention of STREAM "copy" and of vendor peak numbers, and takes the best
of a few timed repetitions after a warm-up. Timing brackets each repetition
with a device synchronize (``torch.accelerator.synchronize`` on torch >= 2.6,
else the backend module's own), so it measures completed copies.

Example:
    >>> import torch
    >>> copy_bandwidth_gbps(torch.device("cpu"), lambda: None, size_bytes=1 << 20, repeats=2) > 0
    True
"""

from __future__ import annotations

import time
from typing import Any, Callable

DEFAULT_SIZE_BYTES = 1 << 30  # 1 GiB per buffer: long enough to dwarf launch overhead on HBM
DEFAULT_REPEATS = 5
_COPIES_PER_REPEAT = 4


def copy_bandwidth_gbps(
    device: Any,
    synchronize: Callable[[], None],
    size_bytes: int = DEFAULT_SIZE_BYTES,
    repeats: int = DEFAULT_REPEATS,
) -> float:
    """Best GB/s of ``dst.copy_(src)`` on ``device`` (10**9 bytes per GB).

    Example:
        >>> import torch
        >>> copy_bandwidth_gbps(torch.device("cpu"), lambda: None, size_bytes=4096, repeats=1) > 0
        True
    """
    import torch

    count = max(size_bytes // 4, 1)
    src = torch.ones(count, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    try:
        dst.copy_(src)  # warm-up: allocation, first-touch, kernel load
        synchronize()
        best = float("inf")
        for _ in range(max(repeats, 1)):
            start = time.perf_counter()
            for _ in range(_COPIES_PER_REPEAT):
                dst.copy_(src)
            synchronize()
            best = min(best, time.perf_counter() - start)
        moved = 2 * count * 4 * _COPIES_PER_REPEAT
        return moved / max(best, 1e-9) / 1e9
    finally:
        del src, dst


def measure_device_bandwidth(device_type: str, index: int, total_memory: int | None = None) -> float:
    """Measure accelerator ``device_type:index`` ("cuda" also on ROCm, "xpu").

    Uses at most 1/8 of the device memory for the two buffers.

    Example:
        >>> measure_device_bandwidth("cuda", 0)  # doctest: +SKIP
        3921.4
    """
    import torch

    device = torch.device(device_type, index)
    size = DEFAULT_SIZE_BYTES
    if total_memory:
        size = max(min(size, total_memory // 16), 1 << 20)

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "synchronize"):

        def sync() -> None:
            accelerator.synchronize(device)
    else:
        backend = getattr(torch, device_type)

        def sync() -> None:
            backend.synchronize(index)

    try:
        return copy_bandwidth_gbps(device, sync, size_bytes=size)
    finally:
        empty = getattr(getattr(torch, device_type, None), "empty_cache", None)
        if empty is not None:
            empty()
