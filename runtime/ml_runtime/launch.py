"""The command after the contract: can it run, and running it in this process's place.

``exec`` replaces the runtime with the command through ``os.execvpe`` (so the command keeps
the PID; in the images tini is PID 1 and forwards signals to it), with the selection's
variables and, for a UID without a writable home, a private ``HOME`` for it alone.

Example:
    >>> command_problem("no-such-cmd-xyz")
    (127, 'runtime-check: command not found: no-such-cmd-xyz')
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence

from ml_runtime.errors import EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, PROG
from ml_runtime.home import private_home


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


def _err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
