"""Builds through podman (buildah inside it): ``podman build``, driven as a subprocess.

The same :class:`~builder.oci.engine.BuildRequest` and the same rendered Dockerfile as a BuildKit
build; what buildah lacks is bridged here, never in the templates:

- per-``RUN`` ``--network=none`` needs buildah 1.30 (podman 4.5): the Dockerfile is passed with
  that flag dropped from its ``RUN`` lines and the whole build runs with ``--network=none``, which
  is what every RUN asked for anyway;
- ``RUN --mount=type=tmpfs,target=/tmp`` removes /tmp from the layer in buildah 1.28 (the mount point is
  deleted after the step): the flag is dropped and every RUN gets an empty host folder of the build's at
  /tmp instead (``--volume``): as with the tmpfs, nothing written there reaches a layer, and /tmp stays;
- compression is not the build's: podman keeps layers uncompressed and compresses at push
  (``podman push --compression-format``), so ``request.compression`` is the push's;
- BuildKit's registry caches (``--cache-from/--cache-to type=registry``) have no buildah
  equivalent that reads BuildKit's cache manifests: left out (the content tag still reuses images);
- ``--timestamp`` fixes the image's created time, and its files' times, to the time the Dockerfile's
  own RUNs set on what they change (the base's ``source_date_epoch``), never the commit's: that would
  give every layer other bytes at each commit (BuildKit takes the created time from SOURCE_DATE_EPOCH
  and leaves the files' times to the RUNs).

Example:
    >>> r = BuildRequest(dockerfile="images/cpu/Dockerfile", context=".", platform="linux/amd64")
    >>> argv(r, "images/cpu/Dockerfile")[:4]
    ['podman', 'build', '--file', 'images/cpu/Dockerfile']
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from builder.config.errors import TargetFailed
from builder.oci.buildkit import supervised
from builder.oci.engine import BuildRequest, BuildResult
from builder.oci.secrets import PODMAN, child_env

#: A Dockerfile step in podman's output: ``[2/4] STEP 3/7: RUN ...`` (FROM is no step, as in BuildKit's count).
STEP = re.compile(r"^(?:\[\d+/\d+\] )?STEP \d+/\d+: (?P<text>(?!FROM ).*)")
CACHED = re.compile(r"^--> Using cache ")
#: ``RUN --network=none``: a per-RUN network flag, which buildah reads only from 1.30.
RUN_NETWORK = re.compile(r"^(RUN\b.*?) --network=none\b", re.MULTILINE)
#: The fixed time every RUN of the rendered Dockerfile gives what it changed (templates' ``fixed_times``).
FIXED_TIME = re.compile(r"touch -h -d @(\d+) ")
#: ``RUN --mount=type=tmpfs,target=/tmp``: /tmp comes from the build's --volume instead.
RUN_TMPFS = re.compile(r"^(RUN\b.*?) --mount=type=tmpfs,target=/tmp(?=\s)", re.MULTILINE)


def dockerfile_for(text: str, per_run_network: bool) -> str:
    """The Dockerfile this buildah reads: no tmpfs /tmp (the build's --volume is), and no ``RUN --network=none``
    where it lacks per-RUN networks (the whole build has none).

    Example:
        >>> dockerfile_for("RUN --network=none --mount=type=tmpfs,target=/tmp true", False)
        'RUN true'
        >>> dockerfile_for("RUN --network=none --mount=type=tmpfs,target=/tmp true", True)
        'RUN --network=none true'
    """
    text = RUN_TMPFS.sub(r"\1", text)
    return text if per_run_network else RUN_NETWORK.sub(r"\1", text)


def argv(request: BuildRequest, dockerfile: str, *, scratch: str = "/nonexistent", epoch: str | None = None,
         iidfile: str | None = None, authfile: str | None = None, tls_verify: bool = True) -> list[str]:
    """The ``podman build`` command line (no shell); *scratch* is the empty folder every RUN gets at /tmp."""
    out = ["podman", "build", "--file", dockerfile, "--platform", request.platform, "--layers",
           "--network=none", "--pull=missing", "--volume", f"{scratch}:/tmp"]
    if request.stage:
        out += ["--target", request.stage]
    for key, value in request.build_args.items():
        out += ["--build-arg", f"{key}={value}"]
    if epoch:
        out += ["--timestamp", epoch]
    for name, path in request.contexts.items():
        out += ["--build-context", f"{name}={path}"]
    for key, value in request.labels.items():
        out += ["--label", f"{key}={value}"]
    if request.no_cache:
        out.append("--no-cache")
    for tag in request.tags:
        out += ["--tag", tag]
    if iidfile:
        out += ["--iidfile", iidfile]
    if authfile:
        out += ["--authfile", authfile]
    if not tls_verify:
        out.append("--tls-verify=false")
    out.append(request.context)
    return out


def run(
    request: BuildRequest,
    *,
    per_run_network: bool,
    on_step: Callable[[int, int, str], None] = lambda n, total, text: None,
    on_log: Callable[[str], None] = lambda line: None,
    cancel: threading.Event | None = None,
    authfile: str | None = None,
    tls_verify: bool = True,
    cwd: Path | None = None,
) -> BuildResult:
    """Run one build; return its image ID. A failed build raises TargetFailed with podman's error."""
    text = ((cwd or Path.cwd()) / request.dockerfile).read_text()
    with tempfile.TemporaryDirectory(prefix="builder-podman-") as tmp:
        dockerfile = Path(tmp) / "Dockerfile"
        dockerfile.write_text(dockerfile_for(text, per_run_network))
        fixed = FIXED_TIME.search(text)
        iidfile, scratch = Path(tmp) / "iid", Path(tmp) / "tmp"
        scratch.mkdir(mode=0o1777)
        scratch.chmod(0o1777)  # as /tmp is: the image's user (1001) writes there too
        command = argv(request, str(dockerfile), scratch=str(scratch), epoch=fixed[1] if fixed else None,
                       iidfile=str(iidfile), authfile=authfile, tls_verify=tls_verify)
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(PODMAN),
                                cwd=cwd, start_new_session=True)
        stdout = proc.stdout
        assert stdout is not None
        (steps, cached, tail), code = supervised(proc, cancel, lambda: _follow(stdout, on_step, on_log))
        if code != 0:
            raise TargetFailed(_error(tail, code))
        image = iidfile.read_text().strip() if iidfile.exists() else ""
    if not image:
        raise TargetFailed("podman build finished without naming the image it made")
    return BuildResult((image if image.startswith("sha256:") else f"sha256:{image}",), steps, cached)


def _follow(stream: IO[str], on_step: Callable[[int, int, str], None],
            on_log: Callable[[str], None]) -> tuple[int, int, list[str]]:
    """Read podman's output to its end; (steps, steps from the cache, the last lines)."""
    steps = cached = 0
    tail: list[str] = []
    for raw in stream:
        line = raw.rstrip()
        if not line:
            continue
        tail = [*tail[-19:], line]
        if match := STEP.match(line):
            steps += 1
            on_log(f"#{steps} {' '.join(match['text'].split())}"[:300])
            on_step(steps - 1, steps, match["text"][:120])
            continue
        if CACHED.match(line) and steps:
            cached += 1
        on_log(line)
    return steps, cached, tail


def _error(tail: Sequence[str], code: int) -> str:
    main = next((line for line in reversed(tail) if line.startswith("Error") or "error" in line.lower()),
                tail[-1] if tail else f"podman build exited {code}")
    return " ".join(main.split())[:400]
