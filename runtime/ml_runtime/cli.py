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
import sys
import traceback
from collections.abc import Sequence
from typing import Any, TextIO

from ml_runtime import __version__
from ml_runtime.contract.spec import MODES, env_mode
from ml_runtime.errors import (
    EXIT_CONTRACT,
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    RuntimeCheckError,
)
from ml_runtime.launch import command_problem, exec_command
from ml_runtime.report.text import OFF_LINE, report_lines, summary_line
from ml_runtime.verdict import evaluate, read_contract


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
    """Config + spec + selection + checks; prints the report; returns (exit code, child env updates).

    ``style`` is ``check`` (runtime-check's lines) or ``notes`` (runtime-checker's, the design
    notes' ``[INFO]``/``[CHECK]``/``[SUCCESS]``/``[ERROR] ... Suggestion:`` format).

    Example:
        >>> import io, argparse
        >>> ns = argparse.Namespace(spec=None, config=None, json=False, mode="off")
        >>> run_contract(ns, io.StringIO())
        (0, {})
    """
    verdict = read_contract(args.spec, args.config, args.mode)
    if verdict.skipped:
        if args.json:
            from ml_runtime.report.items import off_items

            _dump(off_items(), stream)
        else:
            print(OFF_LINE, file=stream, flush=True)
        return EXIT_OK, {}
    try:
        evaluate(verdict)
        if args.json:
            from ml_runtime.report.items import report_items

            _dump(report_items(verdict), stream)
        else:
            print("\n".join(report_lines(verdict, style)), file=stream, flush=True)
        summary = summary_line(verdict.results, verdict.mode, verdict.selection_problems)
        if summary:
            _err(summary)
    except RuntimeCheckError:
        raise
    except Exception as exc:  # a checker bug must not silently pass a strict contract
        if os.environ.get("RUNTIME_CHECK_DEBUG"):
            traceback.print_exc()
        message = f"{PROG}: internal error while checking: {type(exc).__name__}: {exc}"
        if verdict.mode == "strict":
            _err(
                f"{message} (set RUNTIME_CHECK_MODE=warn or off to bypass, "
                "RUNTIME_CHECK_DEBUG=1 for a traceback)"
            )
            return EXIT_CONTRACT, {}
        _err(f"{message} (mode {verdict.mode}, continuing)")
        return EXIT_OK, {}
    return verdict.exit_code, verdict.env


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
    from ml_runtime.policy.config import AcceleratorConfig, load_accelerator_config
    from ml_runtime.policy.selection import select_devices

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
