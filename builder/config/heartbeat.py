"""A line at least every ``HEARTBEAT_S`` seconds while a long step is silent (a ``RUN`` installing
torch, a download of wheels, mmdebstrap under qemu): a person, or a CI system that takes a silent
job for a hung one, sees the step alive. The wheels, the base and the pipeline's progress view use it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator

#: How long a long step stays silent, in seconds: well inside the 15 s a person (or a CI system
#: that takes a silent job for a hung one) waits; the log's own check rounds it up by up to 1 s.
HEARTBEAT_S = 10.0


def _stderr_line(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


#: The heartbeats running, innermost last, and when one last spoke: only the innermost speaks
#: (an outer one, the base's, says what is left once mmdebstrap's is over), counting from the
#: last line any of them said.
_beating: list[object] = []
_last_beat = [0.0]


@contextlib.contextmanager
def heartbeat(status: Callable[[], str], interval: float = HEARTBEAT_S,
              say: Callable[[str], object] = _stderr_line) -> Iterator[None]:
    """While the block runs, say ``status()`` every *interval* seconds: a long step says it is alive.
    Within another heartbeat's block, this one speaks and the outer one waits.

    Example:
        >>> with heartbeat(lambda: "downloading: 3 of 9 wheels", interval=0.05, say=print):
        ...     time.sleep(0.08)
        downloading: 3 of 9 wheels
    """
    me, stop = object(), threading.Event()
    _beating.append(me)
    _last_beat[0] = time.monotonic()

    def beat() -> None:
        while not stop.wait(min(1.0, interval / 4)):
            if _beating[-1] is me and time.monotonic() - _last_beat[0] >= interval:
                _last_beat[0] = time.monotonic()
                with contextlib.suppress(Exception):  # a status that fails to read never stops the step
                    say(status())

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        _beating.remove(me)
