"""The JSON report (``--json``): a list of objects shaped like checks.

A ``device_selection`` item first when there is an accelerator config, one item per check,
and a ``contract_files`` item last naming the files used and the warnings.

Example:
    >>> off_items()[0]["status"]
    'SKIPPED'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ml_runtime.verdict import Verdict


def off_items() -> list[dict[str, Any]]:
    """The report of mode ``off``: one skipped item.

    Example:
        >>> off_items()[0]["reason"]
        'mode off'
    """
    return [
        {
            "item": "all",
            "found": "",
            "required": "",
            "status": "SKIPPED",
            "ok": True,
            "reason": "mode off",
            "suggestion": None,
        }
    ]


def report_items(verdict: Verdict) -> list[dict[str, Any]]:
    """The report of an evaluated verdict.

    Example:
        >>> from ml_runtime.contract.spec import Spec
        >>> from ml_runtime.verdict import Verdict
        >>> [item["item"] for item in report_items(Verdict("strict", Spec("s.yaml")))]
        ['contract_files']
    """
    spec, config, selection, mode = verdict.spec, verdict.config, verdict.selection, verdict.mode
    items: list[dict[str, Any]] = []
    if selection:
        items.append(
            {
                "item": "device_selection",
                "found": " ".join(f"{k}={v}" for k, v in selection.env.items()) or "environment unchanged",
                "required": config.source if config else "",
                "ok": selection.ok,
                "status": "OK" if selection.ok else ("FAIL" if mode == "strict" else "WARN"),
                "reason": "; ".join(selection.problems) or None,
                "suggestion": None,
                "selection": selection.to_dict(),
            },
        )
    source = spec.source if spec else None
    files = {  # last, shaped like a check: which files this report used, and their warnings
        "item": "contract_files",
        "found": f"spec {source}; accelerator config {config.source if config else 'none'}",
        "required": "",
        "status": "OK",
        "ok": True,
        "reason": None,
        "suggestion": None,
        "spec": source,
        "accelerator_config": config.source if config else None,
        "warnings": verdict.warnings,
        "torch_imported": verdict.torch_reason,
    }
    return items + [r.to_dict(mode) for r in verdict.results] + [files]
