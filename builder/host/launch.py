"""``builder run``: run a planned container (:mod:`builder.host.plan`), streaming its output.

The image is pulled when it is not here (the registry client's credentials); stdin is not
forwarded: this runs batch commands, not interactive shells. The container is always removed,
also after Ctrl-C or SIGTERM: it is stopped first (``STOP_TIMEOUT_S``), with the signals held
off while it goes.

Example:
    >>> launch(build_plan(project, ["python", "train.py"]))  # doctest: +SKIP
    0
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from builder.config.errors import UserError
from builder.host.plan import RunPlan
from builder.oci import registry

#: Seconds a container gets between SIGTERM and SIGKILL after Ctrl-C.
STOP_TIMEOUT_S = 10


def engine_info() -> dict[str, Any] | None:
    """``docker info`` of the engine, or None when none answers (``builder run`` asks it about CDI).

    Example:
        >>> engine_info()["ServerVersion"]  # doctest: +SKIP
        '26.1.5+dfsg1'
    """
    try:
        client = docker.from_env(timeout=15)
        try:
            info: dict[str, Any] = client.info()
        finally:
            client.close()
    except (DockerException, OSError):  # requests' errors are OSErrors
        return None
    return info


def ensure_image(client: docker.DockerClient, plan: RunPlan) -> str | None:
    """Make sure the image is here: pull it if not. Returns a line when it pulled.

    Example:
        >>> ensure_image(connect(), plan)  # doctest: +SKIP
        'pulled localhost:5000/ml-runtime:cpu'
    """
    try:
        client.images.get(plan.image)
        return None
    except ImageNotFound:
        pass
    ref = registry.Ref.parse(plan.image)
    try:
        client.images.pull(ref.name, tag=ref.tag, auth_config=registry.credentials(ref.host))
    except DockerException as exc:
        reason = (getattr(exc, "explanation", None) or str(exc)).strip().splitlines()[0][:200]
        raise UserError(
            f"image {plan.image} is not here and pulling it failed ({reason}); "
            f"build it with 'make images TARGETS={plan.target.name}'"
        ) from None
    return f"pulled {plan.image}"

@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt, so a killed ``builder run`` still cleans up."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

@contextlib.contextmanager
def _shielded() -> Iterator[None]:
    """Hold off Ctrl-C and SIGTERM while the container is stopped and removed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

def _start_error(plan: RunPlan, exc: APIError) -> UserError:
    text = (exc.explanation or str(exc)).strip().splitlines()[0][:300]
    if "could not select device driver" in text:
        return UserError(
            f"the engine cannot give GPUs to {plan.image} ({text}); install nvidia-container-toolkit, then "
            "'nvidia-ctk runtime configure --runtime=docker && systemctl restart docker' "
            "(builder doctor checks this)"
        )
    return UserError(f"the engine could not start {plan.image}: {text}")

def run_container(
    client: docker.DockerClient,
    plan: RunPlan,
    *,
    stdout: BinaryIO | None = None,
    stderr: BinaryIO | None = None,
    stop_timeout: int = STOP_TIMEOUT_S,
) -> int:
    """Run the plan, streaming the container's stdout and stderr as they come; return its exit status.

    The container is always removed, also after Ctrl-C or SIGTERM (stopped first, then the
    KeyboardInterrupt goes on).

    Example:
        >>> run_container(connect(), build_plan(project, ["sh", "-c", "exit 7"], target="cpu"))  # doctest: +SKIP
        7
    """
    stdout = stdout or sys.stdout.buffer
    stderr = stderr or sys.stderr.buffer
    container = None
    try:
        with _interruptible():
            try:
                container = client.containers.create(**plan.create_kwargs())
                # Attach before start (logs=True as well) so not a byte of early output is lost.
                stream = client.api.attach(
                    container.id, stdout=True, stderr=True, stream=True, logs=True, demux=True
                )
                container.start()
            except APIError as exc:
                raise _start_error(plan, exc) from None
            try:
                for out, err in stream:
                    for chunk, sink in ((out, stdout), (err, stderr)):
                        if chunk:
                            sink.write(chunk)
                            sink.flush()
                return int(container.wait()["StatusCode"])
            except KeyboardInterrupt:
                with _shielded():
                    # A closed terminal must not keep the container from being stopped.
                    with contextlib.suppress(OSError, ValueError):
                        stderr.write(
                            f"builder run: interrupted; stopping the container (<= {stop_timeout} s)\n".encode()
                        )
                        stderr.flush()
                    with contextlib.suppress(NotFound, APIError):
                        container.stop(timeout=stop_timeout)
                raise
    finally:
        if container is not None:
            with _shielded(), contextlib.suppress(NotFound, APIError):
                container.remove(force=True)

def launch(
    plan: RunPlan,
    *,
    client: docker.DockerClient | None = None,
    say: Callable[[str], object] | None = None,
    stop_timeout: int = STOP_TIMEOUT_S,
) -> int:
    """Refuse on plan problems, make sure the image is here, run; return the command's exit status.

    *client* defaults to :func:`builder.oci.engine.connect` (after the plan checks, so a bad plan
    is reported even without an engine); *say* gets progress lines, default stderr.

    Example:
        >>> launch(build_plan(project, ["python", "-c", "raise SystemExit(3)"]))  # doctest: +SKIP
        3
    """
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    if plan.problems:
        raise UserError(*plan.problems)
    if client is None:
        from builder.oci.engine import connect

        client = connect()
    say(f"builder run: {plan.target.name} ({plan.image}): {plan.reason}")
    for note in plan.notes:
        say(f"note: {note}")
    pulled = ensure_image(client, plan)
    if pulled:
        say(pulled)
    return run_container(client, plan, stop_timeout=stop_timeout)
