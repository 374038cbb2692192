"""Error types shared by every module.

A ``UserError`` is something the user can fix (config, CLI, environment): the CLI prints
its lines and exits 2 without a traceback. Anything else is a fault and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """One or more problems the user can fix; each line names the file/key and the fix.

    Example:
        >>> raise UserError("matrix.yaml: targets[0].torch: '2.x' is not a version")
        Traceback (most recent call last):
        ...
        builder.config.errors.UserError: matrix.yaml: targets[0].torch: '2.x' is not a version
    """

    def __init__(self, *lines: str) -> None:
        self.lines = [line for line in lines if line]
        super().__init__("\n".join(self.lines))


class TargetFailed(Exception):
    """One target failed (build, smoke, push); other targets may still go on."""
