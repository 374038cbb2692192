"""``builder run``: run a planned container (:mod:`builder.host.runspec`), streaming its output.

The image is pulled when it is not here (the registry client's credentials); stdin is not
forwarded: this runs batch commands, not interactive shells. The container is always removed,
also after Ctrl-C or SIGTERM: it is stopped first (``STOP_TIMEOUT_S``), with the signals held
off while it goes.

Example:
    >>> launch(run_spec(project, ["python", "train.py"]))  # doctest: +SKIP
    0
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import BinaryIO

from builder.config.errors import UserError
from builder.host.runspec import RunSpec
from builder.oci import docker, registry
from builder.oci.connect import connect
from builder.oci.engine import Engine, EngineError, EngineFacts

#: Seconds a container gets between SIGTERM and SIGKILL after Ctrl-C.
STOP_TIMEOUT_S = 10


def engine_info(kind: str | None = None) -> EngineFacts | None:
    """The facts of the engine *kind* (default: :func:`builder.oci.connect.connect`'s), or None when it does
    not answer (``builder run`` asks Docker about CDI).

    Example:
        >>> engine_info("docker").version  # doctest: +SKIP
        '26.1.5+dfsg1'
    """
    try:
        engine = connect(timeout=15, kind=kind)
        try:
            return engine.info()
        finally:
            engine.close()
    except (UserError, docker.ClientError, OSError):  # requests' errors are OSErrors
        return None


def ensure_image(engine: Engine, plan: RunSpec) -> str | None:
    """Make sure the image is here: pull it if not. Returns a line when it pulled.

    Example:
        >>> ensure_image(connect(), plan)  # doctest: +SKIP
        'pulled localhost:5000/ml-runtime:cpu'
    """
    if engine.image(plan.image) is not None:
        return None
    ref = registry.Ref.parse(plan.image)
    try:
        engine.pull(plan.image, registry.credentials(ref.host))
    except EngineError as exc:
        reason = str(exc)[:200]
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

def _start_error(plan: RunSpec, exc: EngineError) -> UserError:
    text = str(exc)[:300]
    if "could not select device driver" in text:
        return UserError(
            f"the engine cannot give GPUs to {plan.image} ({text}); install nvidia-container-toolkit, then "
            "'nvidia-ctk runtime configure --runtime=docker && systemctl restart docker' "
            "(builder doctor checks this)"
        )
    return UserError(f"the engine could not start {plan.image}: {text}")

def run_streamed(
    engine: Engine,
    plan: RunSpec,
    *,
    stdout: BinaryIO | None = None,
    stderr: BinaryIO | None = None,
    stop_timeout: int = STOP_TIMEOUT_S,
) -> int:
    """Run the plan, streaming the container's stdout and stderr as they come; return its exit status.

    The container is always removed, also after Ctrl-C or SIGTERM (stopped first, then the
    KeyboardInterrupt goes on).

    Example:
        >>> run_streamed(connect(), run_spec(project, ["sh", "-c", "exit 7"], target="cpu"))  # doctest: +SKIP
        7
    """
    stdout = stdout or sys.stdout.buffer
    stderr = stderr or sys.stderr.buffer
    container = None
    try:
        with _interruptible():
            try:
                container = engine.create(plan.create_kwargs())
                stream = engine.attach(container)  # before start: not a byte of early output is lost
                engine.start(container)
            except EngineError as exc:
                raise _start_error(plan, exc) from None
            try:
                for out, err in stream:
                    for chunk, sink in ((out, stdout), (err, stderr)):
                        if chunk:
                            sink.write(chunk)
                            sink.flush()
                return engine.wait(container)
            except KeyboardInterrupt:
                with _shielded():
                    # A closed terminal must not keep the container from being stopped.
                    with contextlib.suppress(OSError, ValueError):
                        stderr.write(
                            f"builder run: interrupted; stopping the container (<= {stop_timeout} s)\n".encode()
                        )
                        stderr.flush()
                    engine.stop(container, stop_timeout)
                raise
    finally:
        if container is not None:
            with _shielded():
                engine.remove_container(container)


def launch(
    plan: RunSpec,
    *,
    engine: Engine | None = None,
    say: Callable[[str], object] | None = None,
    stop_timeout: int = STOP_TIMEOUT_S,
) -> int:
    """Refuse on plan problems, make sure the image is here, run; return the command's exit status.

    *engine* defaults to the engine the plan was made for (:func:`builder.oci.connect.connect`, after the plan
    checks, so a bad plan is reported even without an engine); *say* gets progress lines, default stderr.

    Example:
        >>> launch(run_spec(project, ["python", "-c", "raise SystemExit(3)"]))  # doctest: +SKIP
        3
    """
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    if plan.problems:
        raise UserError(*plan.problems)
    if engine is None:
        engine = connect(kind=plan.engine)
    say(f"builder run: {plan.target.name} ({plan.image}): {plan.reason}")
    for note in plan.notes:
        say(f"note: {note}")
    pulled = ensure_image(engine, plan)
    if pulled:
        say(pulled)
    return run_streamed(engine, plan, stop_timeout=stop_timeout)
