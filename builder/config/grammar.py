"""Strict grammars for every value that can reach a Dockerfile or a command line.

Each pattern is anchored (``fullmatch``) and admits no newline, backslash, quote or shell
metacharacter, so no YAML or JSON value can add a line or an instruction to a Dockerfile.
The renderer re-checks every interpolated value as a second line of defence.
"""

from __future__ import annotations

import re

#: Docker tag grammar (distribution/reference), lower-cased because a tag is also a folder name.
TAG = re.compile(r"[a-z0-9_][a-z0-9_.-]{0,127}")
#: Target names become tags and folders under images/.
TARGET_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
#: Registry host[:port]/repository[/more] (no tag, no digest).
REGISTRY = re.compile(
    r"(?P<host>[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?)"
    r"/(?P<repo>[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*)"
)
#: An image reference pinned by digest: name@sha256:<64 hex>.
PINNED_IMAGE = re.compile(r"[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}")
#: A local image ID.
IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
#: Any image reference (name[:tag][@digest]).
IMAGE_REF = re.compile(r"[a-z0-9][a-z0-9._/:-]*(@sha256:[0-9a-f]{64})?")
#: PEP 440 public version plus an optional local part, e.g. 2.7.1 or 2.7.1+cu118.
VERSION = re.compile(r"[0-9]+(\.[0-9]+){0,3}((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?(\+[a-z0-9.]+)?")
#: Accelerator versions: 11.8, 5.7, 6.2.4.
ACCEL_VERSION = re.compile(r"[0-9]+(\.[0-9]+){0,2}")
#: A pip requirement without URLs, markers or quotes: name[extra,...] op version[, op version].
REQUIREMENT = re.compile(
    r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?"
    r"(\[[A-Za-z0-9._-]+(,[A-Za-z0-9._-]+)*\])?"
    r"( ?(==|!=|<=|>=|~=|<|>|===) ?[A-Za-z0-9.*+!]+( ?, ?(==|!=|<=|>=|~=|<|>) ?[A-Za-z0-9.*+!]+)*)?"
)
#: Python module names (for the start-up bytecode warm-up).
MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
#: Label keys: reverse-DNS style.
LABEL_KEY = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?")
#: Label values: printable text without quotes, backslashes, $ or control characters.
LABEL_VALUE = re.compile(r"[^\"'\\$`\x00-\x1f\x7f]{0,256}")
#: http(s) or file URLs for wheel indexes: no spaces, quotes, backslashes or shell metacharacters.
URL = re.compile(r"(https?|file)://[A-Za-z0-9._~:/?#\[\]@!%+,;=-]+")
#: The OCI platforms images are built for: Linux on x86_64 and on aarch64 (Grace Hopper/Blackwell).
#: A layer of the layer plan: lowercase, becomes the build argument WHEELS_<NAME> (dashes -> _).
LAYER_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")
#: A wheel-name pattern of the layer plan: a canonical name with fnmatch's * and ?.
WHEEL_PATTERN = re.compile(r"[a-z0-9*?][a-z0-9*?._-]{0,99}")
PLATFORM = re.compile(r"linux/(amd64|arm64)")
#: Debian suite and package names.
DEB_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]*")

#: Characters that must never appear in an interpolated Dockerfile value.
FORBIDDEN_IN_DOCKERFILE = re.compile(r"[\x00-\x1f\x7f\\]")


def check(pattern: re.Pattern[str], value: str, what: str) -> str:
    """Return *value* if it fully matches *pattern*, else raise ``ValueError`` naming *what*.

    Example:
        >>> check(TAG, "cpu", "a Docker tag")
        'cpu'
    """
    if not pattern.fullmatch(value):
        raise ValueError(f"{value!r} is not {what}")
    return value
