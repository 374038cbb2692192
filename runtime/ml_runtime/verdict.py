"""What the contract and the device selection decide, without printing anything.

:func:`read_contract` finds and validates the files and the mode; :func:`evaluate` probes the
host, selects devices and runs the checks. The :class:`Verdict` holds the results, the exit code
and the command's environment; :mod:`ml_runtime.report` formats it and :mod:`ml_runtime.cli`
prints it. Probing, selection and the checks are imported when first needed (a container
start in mode ``off`` pays for none of them).

Example:
    >>> verdict = read_contract(None, None, "off")
    >>> verdict.skipped, verdict.exit_code, verdict.env
    (True, 0, {})
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ml_runtime.contract.locate import load_spec
from ml_runtime.contract.spec import Spec, env_mode, resolve_mode
from ml_runtime.errors import EXIT_CONTRACT, EXIT_OK, ConfigError

if TYPE_CHECKING:
    from ml_runtime.contract.result import CheckResult
    from ml_runtime.policy.config import AcceleratorConfig
    from ml_runtime.policy.selection import Selection


@dataclass
class Verdict:
    """The contract's outcome: files used, mode, selection and check results.

    ``spec`` is None in mode ``off`` (nothing was read); ``selection`` is None without an
    accelerator config.

    Example:
        >>> Verdict("strict").exit_code
        0
    """

    mode: str
    spec: Spec | None = None
    config: AcceleratorConfig | None = None
    selection: Selection | None = None
    results: list[CheckResult] = field(default_factory=list)
    torch_reason: str | None = None  # why the probe imported torch, and what it cost (None: it did not)

    @property
    def skipped(self) -> bool:
        """Mode ``off``: no probe, no checks, no selection."""
        return self.mode == "off"

    @property
    def failed(self) -> list[CheckResult]:
        """The checks that do not hold."""
        return [r for r in self.results if not r.ok]

    @property
    def selection_problems(self) -> list[str]:
        """Why the device selection failed (empty when it held or there was none)."""
        return list(self.selection.problems) if self.selection is not None else []

    @property
    def warnings(self) -> list[str]:
        """Full sentences for ``[WARN]`` lines (keys without effect)."""
        return list(self.selection.warnings) if self.selection is not None else []

    @property
    def exit_code(self) -> int:
        """3 when a check or the selection failed in strict mode, else 0."""
        if (self.failed or self.selection_problems) and self.mode == "strict":
            return EXIT_CONTRACT
        return EXIT_OK

    @property
    def env(self) -> dict[str, str]:
        """What the command's environment gets (nothing when the contract stops it)."""
        if self.exit_code != EXIT_OK or self.selection is None:
            return {}
        return self.selection.env


def read_contract(spec_path: str | None, config_path: str | None, cli_mode: str | None) -> Verdict:
    """The mode and, unless it is ``off``, the accelerator config and the spec (ConfigError if bad).

    Mode: ``--mode`` over ``$RUNTIME_CHECK_MODE`` over the spec's ``mode``; a mode ``off`` from
    the first two reads no file at all.

    Example:
        >>> read_contract(None, None, None).spec.source  # doctest: +ELLIPSIS
        '.../ml_runtime/default-spec.yaml'
    """
    mode = cli_mode or env_mode()
    if mode == "off":
        return Verdict(mode)
    config = load_config(config_path)
    spec = load_spec(spec_path, contract=config.runtime_contract if config else None)
    return Verdict(resolve_mode(cli_mode, spec.mode), spec, config)


def load_config(cli_path: str | None) -> AcceleratorConfig | None:
    """The accelerator config (None when absent); a spec passed as --config is named as such.

    Example:
        >>> load_config(None) is None
        True
    """
    from ml_runtime.contract.fields import load_yaml_mapping
    from ml_runtime.policy.config import load_accelerator_config, looks_like_spec, resolve_config_path

    try:
        return load_accelerator_config(cli_path)
    except ConfigError:
        found = resolve_config_path(cli_path)
        if found is not None and looks_like_spec(load_yaml_mapping(*found)):
            raise ConfigError(
                f"{found[1]}: this is a runtime spec (required_features/dependencies), not an accelerator "
                f"config: pass it with --spec {found[1]} (--config takes accelerator-config.yaml; the notes' "
                f"runtime-checker --config takes the spec)"
            ) from None
        raise


def evaluate(verdict: Verdict) -> Verdict:
    """Probe the host, select devices and run the checks of ``verdict.spec`` (filled in place).

    The probe is isolated: this process is about to exec the command and must not hold an
    accelerator context. torch's build comes from the image's record and the devices from the
    driver's management library; torch is imported (once, in a child) only for what only it can
    tell, a measured bandwidth (:mod:`ml_runtime.devices.gather`), and ``torch_reason`` says why.

    Example:
        >>> from ml_runtime.contract.spec import Spec
        >>> evaluate(Verdict("strict", Spec("s.yaml"))).results
        []
    """
    from ml_runtime.contract.checks import run_checks
    from ml_runtime.devices.probe import probe_host
    from ml_runtime.policy.selection import select_devices

    spec, config = verdict.spec, verdict.config
    if spec is None:
        return verdict
    versions_only = not spec.features and config is None and not any(
        d.full_distribution or d.vendor_agnostic_wheel or d.host_driver for d in spec.dependencies
    )
    probe = probe_host(
        isolated=True, measure_bandwidth="memory_bandwidth_gbps" in spec.features, versions_only=versions_only
    )
    verdict.torch_reason = probe.torch_reason
    verdict.selection = select_devices(config, probe) if config else None
    chosen = verdict.selection.devices if verdict.selection and verdict.selection.devices else probe.devices
    verdict.results = run_checks(spec, probe, chosen)
    return verdict
