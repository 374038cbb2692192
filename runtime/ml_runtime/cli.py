"""``runtime-check``: the image entrypoint and its diagnostic subcommands.

Usage::

    runtime-check exec  [--spec F] [--config F] [--json] [--mode M] -- CMD [ARGS...]
    runtime-check check [--spec F] [--config F] [--json] [--mode M]
    runtime-check probe [--json] [--self-test]
    runtime-check select [--config F] [--json] [--mode M]
    runtime-check metrics [--json]

``exec`` checks the contract, applies device selection, gives a UID without a
writable home a private ``HOME``, then replaces itself with CMD through
``os.execvp`` (so CMD keeps the PID; in the images tini is PID 1 and forwards
signals to it). Reports go to stderr for ``exec``
(stdout belongs to CMD) and to stdout for the other subcommands.

Mode ``off`` (from --mode, $RUNTIME_CHECK_MODE or the spec) skips probing,
checks and selection entirely: the command is executed untouched.

Exit codes: 0 ok; 2 usage, spec or config error; 3 contract failed in strict
mode; 126 command not executable; 127 command not found; otherwise CMD's own.

Example:
    $ runtime-check exec -- python train.py
    [CHECK] pytorch: 2.13.0+cpu -> OK
    [CHECK] pytorch.full_distribution: torch.distributed (gloo) -> OK
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import traceback
from collections.abc import Sequence
from typing import Any, TextIO

from ml_runtime import __version__
from ml_runtime.contract.spec import MODES, env_mode, load_spec, resolve_mode
from ml_runtime.errors import (
    EXIT_CONTRACT,
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    ConfigError,
    RuntimeCheckError,
)
from ml_runtime.home import private_home

PROG = "runtime-check"


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser for all subcommands.

    Example:
        >>> build_parser().parse_args(["probe", "--json"]).json
        True
    """
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="In-image runtime: contract checks, accelerator probe, device selection, metrics.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="{exec,check,probe,select,metrics}")
    sub.required = True

    def contract_options(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--spec", metavar="FILE", help="runtime-spec.yaml (overrides $RUNTIME_SPEC and /workspace)"
        )
        p.add_argument(
            "--config",
            metavar="FILE",
            help="accelerator-config.yaml (overrides $ACCELERATOR_CONFIG and /workspace)",
        )
        p.add_argument("--json", action="store_true", help="print the results as a JSON list of objects")
        p.add_argument("--mode", choices=MODES, help="overrides $RUNTIME_CHECK_MODE and the spec's mode")

    p_exec = sub.add_parser(
        "exec",
        help="check the contract, then exec the command",
        usage=f"{PROG} exec [--spec FILE] [--config FILE] [--json] [--mode MODE] -- CMD [ARGS...]",
    )
    contract_options(p_exec)
    p_exec.add_argument("command", nargs=argparse.REMAINDER, help="the command to run after '--'")

    contract_options(sub.add_parser("check", help="check the contract only"))

    p_probe = sub.add_parser("probe", help="describe the accelerator, torch build and distributed backend")
    p_probe.add_argument("--json", action="store_true")
    p_probe.add_argument(
        "--self-test",
        action="store_true",
        help="also report uid, HOME, PID 1, and run a small tensor op on the CPU and the accelerator",
    )

    p_select = sub.add_parser("select", help="show which devices accelerator-config.yaml selects")
    p_select.add_argument("--config", metavar="FILE")
    p_select.add_argument("--json", action="store_true")
    p_select.add_argument("--mode", choices=MODES)

    p_metrics = sub.add_parser("metrics", help="per-device utilisation, temperature and memory")
    p_metrics.add_argument("--json", action="store_true")
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``argv``; for ``exec`` everything after the first ``--`` is the command.

    Example:
        >>> parse_args(["exec", "--json", "--", "python", "--json"]).command
        ['python', '--json']
    """
    parser = build_parser()
    argv = list(argv)
    if argv and argv[0] == "exec" and "--" in argv:
        cut = argv.index("--")
        args = parser.parse_args(argv[:cut])
        if args.command:
            parser.error(f"unexpected arguments before '--': {' '.join(args.command)}")
        args.command = argv[cut + 1 :]
        return args
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns the exit code.

    Example:
        >>> main(["check", "--mode", "off"])
        [CHECK] all checks skipped (mode off)
        0
    """
    args = parse_args(sys.argv[1:] if argv is None else argv)
    handler = {
        "exec": cmd_exec,
        "check": cmd_check,
        "probe": cmd_probe,
        "select": cmd_select,
        "metrics": cmd_metrics,
    }[args.subcommand]
    try:
        return handler(args)
    except RuntimeCheckError as exc:
        _err(str(exc))
        return exc.exit_code


def checker_main(argv: Sequence[str] | None = None) -> int:
    """``runtime-checker``: the design notes' command, flags and report format.

    ``runtime-checker --config runtime-spec.yaml`` checks the contract (here ``--config`` is the
    spec, as in the notes; the accelerator config is ``--accelerator-config``) and prints
    ``[INFO]``/``[CHECK]``/``[SUCCESS]`` or ``[ERROR] ... Suggestion:`` lines on stdout; exit 0
    or 3 (2 for a bad file). With ``-- CMD`` it then runs CMD like ``runtime-check exec``.

    Example:
        >>> checker_main(["--mode", "off"])
        [CHECK] all checks skipped (mode off)
        0
    """
    parser = argparse.ArgumentParser(
        prog="runtime-checker",
        description="Check the runtime contract (the design notes' command); runtime-check is the full tool.",
    )
    parser.add_argument("--config", dest="spec", metavar="SPEC", help="runtime-spec.yaml (as in the notes)")
    parser.add_argument("--accelerator-config", dest="config", metavar="FILE", help="accelerator-config.yaml")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--mode", choices=MODES, help="overrides $RUNTIME_CHECK_MODE and the spec's mode")
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    args = parser.parse_args(argv)
    args.command = command
    try:
        if command:
            missing = command_problem(command[0])
            if missing:
                _err(missing[1])
                return missing[0]
            code, env_updates = run_contract(args, sys.stderr, style="notes")
            if code != EXIT_OK:
                return code
            return exec_command(command, env_updates)
        code, _ = run_contract(args, sys.stdout, style="notes")
        return code
    except RuntimeCheckError as exc:
        _err(f"[ERROR] {exc}")
        return exc.exit_code


def _err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _dump(data: Any, stream: TextIO) -> None:
    print(json.dumps(data, indent=2), file=stream, flush=True)


# ---------------------------------------------------------------- contract


def run_contract(
    args: argparse.Namespace, stream: TextIO, style: str = "check"
) -> tuple[int, dict[str, str]]:
    """Config + spec + selection + checks; returns (exit code, child env updates).

    ``style`` is ``check`` (runtime-check's lines) or ``notes`` (runtime-checker's, the design
    notes' ``[INFO]``/``[CHECK]``/``[SUCCESS]``/``[ERROR] ... Suggestion:`` format).

    Example:
        >>> import io, argparse
        >>> ns = argparse.Namespace(spec=None, config=None, json=False, mode="off")
        >>> run_contract(ns, io.StringIO())
        (0, {})
    """
    mode = args.mode or env_mode()
    if mode != "off":
        config = _load_config(args.config)
        contract = config.runtime_contract if config else None
        spec = load_spec(args.spec, contract=contract)
        mode = resolve_mode(args.mode, spec.mode)
    if mode == "off":
        _report_off(args, stream)
        return EXIT_OK, {}
    try:
        return _checked(args, spec, config, mode, stream, style)
    except RuntimeCheckError:
        raise
    except Exception as exc:  # a checker bug must not silently pass a strict contract
        if os.environ.get("RUNTIME_CHECK_DEBUG"):
            traceback.print_exc()
        message = f"{PROG}: internal error while checking: {type(exc).__name__}: {exc}"
        if mode == "strict":
            _err(
                f"{message} (set RUNTIME_CHECK_MODE=warn or off to bypass, "
                "RUNTIME_CHECK_DEBUG=1 for a traceback)"
            )
            return EXIT_CONTRACT, {}
        _err(f"{message} (mode {mode}, continuing)")
        return EXIT_OK, {}


def _load_config(cli_path: str | None) -> Any:
    """The accelerator config (None when absent); a spec passed as --config is named as such."""
    from ml_runtime.contract.spec import load_yaml_mapping
    from ml_runtime.policy.selection import load_accelerator_config, looks_like_spec, resolve_config_path

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


def _report_off(args: argparse.Namespace, stream: TextIO) -> None:
    if args.json:
        _dump(
            [
                {
                    "item": "all",
                    "found": "",
                    "required": "",
                    "status": "SKIPPED",
                    "ok": True,
                    "reason": "mode off",
                    "suggestion": None,
                }
            ],
            stream,
        )
    else:
        print("[CHECK] all checks skipped (mode off)", file=stream, flush=True)


def _checked(
    args: argparse.Namespace, spec: Any, config: Any, mode: str, stream: TextIO, style: str
) -> tuple[int, dict[str, str]]:
    from ml_runtime.contract.checks import notes_lines, run_checks, summary_line
    from ml_runtime.devices.probe import probe_host
    from ml_runtime.policy.selection import select_devices

    # Isolated: this process is about to exec the command and must not hold an accelerator context.
    # torch is imported (once, in the child) only when a check needs more than versions.
    needs_torch = bool(spec.features) or config is not None or any(
        d.full_distribution or d.vendor_agnostic_wheel for d in spec.dependencies
    )
    probe = probe_host(
        isolated=True, measure_bandwidth="memory_bandwidth_gbps" in spec.features, torch_needed=needs_torch
    )
    selection = select_devices(config, probe) if config else None
    devices = selection.devices if selection and selection.devices else probe.devices
    results = run_checks(spec, probe, devices)
    warnings = list(selection.warnings) if selection else []

    failed = [r for r in results if not r.ok]
    selection_failed = selection is not None and not selection.ok
    if args.json:
        items: list[dict[str, Any]] = []
        if selection:
            items.append(
                {
                    "item": "device_selection",
                    "found": " ".join(f"{k}={v}" for k, v in selection.env.items())
                    or "environment unchanged",
                    "required": config.source if config else "",
                    "ok": selection.ok,
                    "status": "OK" if selection.ok else ("FAIL" if mode == "strict" else "WARN"),
                    "reason": "; ".join(selection.problems) or None,
                    "suggestion": None,
                    "selection": selection.to_dict(),
                },
            )
        files = {  # last, shaped like a check: which files this report used, and their warnings
            "item": "contract_files",
            "found": f"spec {spec.source}; accelerator config {config.source if config else 'none'}",
            "required": "",
            "status": "OK",
            "ok": True,
            "reason": None,
            "suggestion": None,
            "spec": spec.source,
            "accelerator_config": config.source if config else None,
            "warnings": warnings,
        }
        _dump(items + [r.to_dict(mode) for r in results] + [files], stream)
    else:
        lines = [f"[INFO] Loading runtime contract from {spec.source}",
                 f"[INFO] Accelerator config: {config.source if config else 'none (all devices)'}"]
        lines += [f"[WARN] {w}" for w in warnings]
        lines += selection.lines(mode) if selection else []
        if style == "notes":
            lines += notes_lines(results, mode)
            if selection is not None and selection_failed:
                lines.append(f"[ERROR] Device selection failed: {'; '.join(selection.problems)} "
                             f"Suggestion: change device_selection_policy in {config.source}, or run on a "
                             f"host with a matching device.")
            if not failed and not selection_failed:
                lines.append("[SUCCESS] All checks passed. Environment is compatible.")
        else:
            lines += [r.line(mode) for r in results]
        print("\n".join(lines), file=stream, flush=True)

    summary = summary_line(results, mode)
    if selection is not None and selection_failed:
        what = f"device selection failed ({'; '.join(selection.problems)})"
        if summary:
            summary = summary.replace(f"{PROG}: ", f"{PROG}: {what}; ", 1)
        else:
            tail = ", or set RUNTIME_CHECK_MODE=warn" if mode == "strict" else f" (mode {mode}, continuing)"
            summary = f"{PROG}: {what}{tail}"
    if summary:
        _err(summary)
    if (failed or selection_failed) and mode == "strict":
        return EXIT_CONTRACT, {}
    return EXIT_OK, selection.env if selection else {}


def cmd_check(args: argparse.Namespace) -> int:
    """``check``: run the contract, print the report, exit 0/2/3.

    Example:
        >>> cmd_check(argparse.Namespace(spec=None, config=None, json=False, mode="off"))
        [CHECK] all checks skipped (mode off)
        0
    """
    code, _ = run_contract(args, sys.stdout)
    return code


def cmd_exec(args: argparse.Namespace) -> int:
    """``exec``: run the contract, then replace this process with the command.

    Example:
        >>> cmd_exec(argparse.Namespace(spec=None, config=None, json=False, mode="off", command=[]))
        2
    """
    if not args.command:
        _err(
            f"usage: {PROG} exec [--spec FILE] [--config FILE] [--json] [--mode MODE] -- CMD [ARGS...]\n"
            f"{PROG} exec: error: missing command after '--'"
        )
        return EXIT_USAGE
    missing = command_problem(args.command[0])
    if missing:  # fail fast, before a possibly slow contract check
        _err(missing[1])
        return missing[0]
    code, env_updates = run_contract(args, sys.stderr)
    if code != EXIT_OK:
        return code
    return exec_command(args.command, env_updates)


def command_problem(name: str) -> tuple[int, str] | None:
    """(exit code, message) when ``name`` cannot be executed, else None.

    Example:
        >>> command_problem("sh") is None, command_problem("no-such-cmd-xyz")[0]
        (True, 127)
    """
    if shutil.which(name):
        return None
    if os.sep in name and os.path.exists(name):
        return EXIT_NOT_EXECUTABLE, f"{PROG}: permission denied: {name} (not an executable file)"
    return EXIT_NOT_FOUND, f"{PROG}: command not found: {name}"


def exec_command(command: Sequence[str], env_updates: dict[str, str]) -> int:
    """``os.execvpe`` the command with ``env_updates`` for it alone.

    Returns only when exec fails: 127 not found, 126 not executable.

    Example:
        >>> exec_command(["/nonexistent/tool"], {})
        127
    """
    env = dict(os.environ)
    env.update(env_updates)
    home = private_home(env.get("HOME", ""))
    if home is not None:  # any UID (docker run -u, runAsUser) gets a writable HOME for its caches
        env["HOME"] = home
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], list(command), env)
    except FileNotFoundError:
        _err(f"{PROG}: command not found: {command[0]}")
        return EXIT_NOT_FOUND
    except PermissionError:
        _err(f"{PROG}: permission denied: {command[0]} (not executable?)")
        return EXIT_NOT_EXECUTABLE
    except OSError as exc:
        _err(f"{PROG}: cannot execute {command[0]}: {exc.strerror or exc}")
        return EXIT_NOT_EXECUTABLE
    return EXIT_NOT_EXECUTABLE  # unreachable: execvpe does not return


# ---------------------------------------------------------------- diagnostics


def cmd_probe(args: argparse.Namespace) -> int:
    """``probe``: print vendor, backend, torch build, devices, driver, CPU.

    Example:
        >>> cmd_probe(argparse.Namespace(json=False))  # doctest: +ELLIPSIS
        vendor: ...
        0
    """
    from ml_runtime.devices.probe import format_probe, probe_host

    result = probe_host()
    report = result.to_dict()
    if getattr(args, "self_test", False):
        from ml_runtime.devices.selftest import self_test

        report["self_test"] = self_test()
    if args.json:
        _dump(report, sys.stdout)
    else:
        print(format_probe(result), flush=True)
        for key, value in report.get("self_test", {}).get("process", {}).items():
            print(f"self-test {key}: {value}")
        for device, check in report.get("self_test", {}).get("compute", {}).items():
            print(f"self-test compute on {device}: {'OK' if check['ok'] else 'FAIL ' + str(check)}")
    return EXIT_OK


def cmd_select(args: argparse.Namespace) -> int:
    """``select``: show the devices and environment accelerator-config.yaml gives.

    Without a config file the default (backend auto, all devices) is shown.
    Mode: ``--mode`` over ``$RUNTIME_CHECK_MODE`` over strict.

    Example:
        >>> cmd_select(argparse.Namespace(config=None, json=True, mode=None))  # doctest: +ELLIPSIS
        {...
        0
    """
    from ml_runtime.devices.probe import probe_host
    from ml_runtime.policy.selection import AcceleratorConfig, load_accelerator_config, select_devices

    mode = args.mode or env_mode() or "strict"
    config = load_accelerator_config(args.config)
    selection = select_devices(config or AcceleratorConfig(source="(default)"), probe_host())
    if config is None:
        selection.notes.append(
            "no accelerator config found (--config, $ACCELERATOR_CONFIG, "
            "/workspace/accelerator-config.yaml); showing the default: all devices"
        )
    if args.json:
        _dump(selection.to_dict(), sys.stdout)
    else:
        print("\n".join(selection.lines(mode)), flush=True)
    if selection.problems and mode == "strict":
        _err(f"{PROG}: device selection failed: {'; '.join(selection.problems)}")
        return EXIT_CONTRACT
    return EXIT_OK


def cmd_metrics(args: argparse.Namespace) -> int:
    """``metrics``: per-device utilisation, temperature and memory.

    Example:
        >>> cmd_metrics(argparse.Namespace(json=True))  # doctest: +ELLIPSIS
        {...
        0
    """
    from ml_runtime.devices.metrics import collect_metrics

    report = collect_metrics()
    if args.json:
        _dump(report.to_dict(), sys.stdout)
    else:
        for device in report.devices:
            print(device.line())
        if not report.devices:
            print("[METRICS] no devices")
        for note in report.notes:
            print(f"note: {note}")
        sys.stdout.flush()
    return EXIT_OK
