"""The text reports: runtime-check's ``[CHECK]`` lines and runtime-checker's, the design notes'.

runtime-check prints ``[INFO]`` lines naming the files, ``[WARN]`` lines, the ``[SELECT]``
lines and one ``[CHECK] <item>: <found> -> OK|FAIL|WARN (...)`` line per item; runtime-checker
(``style="notes"``) prints the notes' ``[CHECK] <title>: ... -> OK (required: ...)``,
``[ERROR] ... Suggestion: ...`` and ``[SUCCESS]`` lines instead. The one-line summary after
failures goes to stderr (:func:`summary_line`).

Example:
    >>> from ml_runtime.contract.result import CheckResult
    >>> from ml_runtime.contract.spec import Spec
    >>> from ml_runtime.verdict import Verdict
    >>> verdict = Verdict("strict", Spec("s.yaml"), results=[CheckResult("pytorch", "2.13.0+cpu", True, "")])
    >>> print("\\n".join(report_lines(verdict)))
    [INFO] Loading runtime contract from s.yaml
    [INFO] Accelerator config: none (all devices)
    [CHECK] pytorch: 2.13.0+cpu -> OK
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ml_runtime.errors import PROG

if TYPE_CHECKING:  # only the types: a container start in mode off imports this module alone
    from ml_runtime.contract.result import CheckResult
    from ml_runtime.verdict import Verdict

OFF_LINE = "[CHECK] all checks skipped (mode off)"


def report_lines(verdict: Verdict, style: str = "check") -> list[str]:
    """The report of an evaluated verdict: ``check`` (runtime-check's) or ``notes`` (runtime-checker's).

    Example:
        >>> from ml_runtime.contract.spec import Spec
        >>> from ml_runtime.verdict import Verdict
        >>> report_lines(Verdict("strict", Spec("s.yaml")), style="notes")[-1]
        '[SUCCESS] All checks passed. Environment is compatible.'
    """
    spec, config, selection, mode = verdict.spec, verdict.config, verdict.selection, verdict.mode
    lines = [
        f"[INFO] Loading runtime contract from {spec.source if spec else 'none'}",
        f"[INFO] Accelerator config: {config.source if config else 'none (all devices)'}",
    ]
    if verdict.torch_reason:  # the start's one slow step: say what it cost and why
        lines.append(f"[INFO] Probe: {verdict.torch_reason}")
    lines += [f"[WARN] {w}" for w in verdict.warnings]
    lines += selection.lines(mode) if selection else []
    if style != "notes":
        return lines + [r.line(mode) for r in verdict.results]
    lines += notes_lines(verdict.results, mode)
    if verdict.selection_problems:
        lines.append(
            f"[ERROR] Device selection failed: {'; '.join(verdict.selection_problems)} "
            f"Suggestion: change device_selection_policy in {config.source if config else 'the config'}, "
            "or run on a host with a matching device."
        )
    if not verdict.failed and not verdict.selection_problems:
        lines.append("[SUCCESS] All checks passed. Environment is compatible.")
    return lines


#: The design notes' names for the contract items (runtime-checker's report).
NOTES_TITLES = {
    "gpu_compute_capability": "GPU compute capability",
    "driver_version_min": "Driver version",
    "memory_bandwidth_gbps": "Memory bandwidth",
    "device_memory_gb": "Device memory",
}


def notes_title(item: str) -> str:
    """The notes' title of a contract item.

    Example:
        >>> notes_title("gpu_compute_capability"), notes_title("pytorch")
        ('GPU compute capability', 'PyTorch version')
        >>> notes_title("pytorch.full_distribution")
        'PyTorch distributed'
    """
    if item in NOTES_TITLES:
        return NOTES_TITLES[item]
    name, _, flag = item.partition(".")
    title = "PyTorch" if name.lower() in ("pytorch", "torch") else name
    return {"": f"{title} version", "full_distribution": f"{title} distributed",
            "vendor_agnostic_wheel": f"{title} wheel", "host_driver": f"{title} host driver"}.get(flag, item)


def notes_lines(results: Sequence[CheckResult], mode: str) -> list[str]:
    """The design notes' report: ``[CHECK] ... -> OK (required: ...)`` or ``[ERROR] ... Suggestion: ...``.

    Example:
        >>> from ml_runtime.contract.result import CheckResult
        >>> ok = CheckResult("pytorch", "2.13.0+cpu", True, "pytorch >=2.1")
        >>> bad = CheckResult("gpu_compute_capability", "none (CPU only)", False, "an NVIDIA GPU (sm_80)",
        ...                   "requires an NVIDIA GPU (sm_80)", "run on an NVIDIA GPU host")
        >>> print("\\n".join(notes_lines([ok, bad], "strict")))  # doctest: +NORMALIZE_WHITESPACE
        [CHECK] PyTorch version: 2.13.0+cpu -> OK (required: pytorch >=2.1)
        [ERROR] GPU compute capability mismatch: Required: an NVIDIA GPU (sm_80)
                Found: none (CPU only) Suggestion: run on an NVIDIA GPU host.
    """
    lines = []
    for r in results:
        title = notes_title(r.item)
        if r.ok:
            lines.append(f"[CHECK] {title}: {r.found} -> OK (required: {r.required})")
        elif mode == "strict":
            tip = (r.suggestion or r.reason or "see runtime-spec.yaml").rstrip(".")
            lines.append(
                f"[ERROR] {title} mismatch: Required: {r.required} Found: {r.found} Suggestion: {tip}."
            )
        else:
            lines.append(
                f"[WARN] {title} mismatch: Required: {r.required} Found: {r.found} (mode {mode}, continuing)"
            )
    return lines


def summary_line(
    results: Sequence[CheckResult], mode: str, selection_problems: Sequence[str] = ()
) -> str | None:
    """The one-line suggestion after failures of the checks or of the selection (None when all held).

    Example:
        >>> from ml_runtime.contract.result import CheckResult
        >>> r = CheckResult("x", "y", False, "z", "why", "run on a GPU host")
        >>> summary_line([r], "strict")
        'runtime-check: 1 of 1 checks failed: run on a GPU host, or set RUNTIME_CHECK_MODE=warn'
        >>> print(summary_line([r], "warn", ["no device matches"]))
        runtime-check: device selection failed (no device matches); 1 of 1 checks failed
        (mode warn, continuing): run on a GPU host
        >>> print(summary_line([], "strict", ["no device matches"]))
        runtime-check: device selection failed (no device matches), or set RUNTIME_CHECK_MODE=warn
    """
    failed = [r for r in results if not r.ok]
    what = []
    if selection_problems:
        what.append(f"device selection failed ({'; '.join(selection_problems)})")
    if failed:
        what.append(f"{len(failed)} of {len(results)} checks failed")
    if not what:
        return None
    head = f"{PROG}: {'; '.join(what)}"
    advice = f": {_advice(failed)}" if failed else ""
    if mode == "strict":
        return f"{head}{advice}, or set RUNTIME_CHECK_MODE=warn"
    return f"{head} (mode {mode}, continuing){advice}"


def _advice(failed: Sequence[CheckResult]) -> str:
    hints = list(dict.fromkeys(r.suggestion for r in failed if r.suggestion))
    # Drop a hint that a more specific one already contains ("... NVIDIA GPU" vs "... NVIDIA GPU of ...").
    hints = [h for h in hints if not any(o != h and o.startswith(h) for o in hints)]
    return "; ".join(hints) if hints else "see the lines above"
