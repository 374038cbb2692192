"""Exceptions that carry the process exit code the CLI should use.

Exit codes: 0 success, 2 usage or configuration error, 3 contract failed
(strict mode), 126 command not executable, 127 command not found.

Example:
    >>> from ml_runtime.errors import ConfigError
    >>> ConfigError("runtime-spec.yaml: mode: 'x' is not one of strict, warn, off").exit_code
    2
"""

from __future__ import annotations

#: The name every message of the runtime starts with (``runtime-check: ...``).
PROG = "runtime-check"

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_CONTRACT = 3
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127


class RuntimeCheckError(Exception):
    """Base error; ``str(error)`` is the one line printed to the user.

    Example:
        >>> RuntimeCheckError("boom").exit_code
        1
    """

    exit_code = 1


class ConfigError(RuntimeCheckError):
    """A spec, config, environment value or usage is invalid (exit 2).

    Example:
        >>> str(ConfigError("a.yaml: count: must be a positive integer"))
        'a.yaml: count: must be a positive integer'
    """

    exit_code = EXIT_USAGE


class ContractError(RuntimeCheckError):
    """The host does not satisfy the contract in strict mode (exit 3).

    Example:
        >>> ContractError("no device matches").exit_code
        3
    """

    exit_code = EXIT_CONTRACT
