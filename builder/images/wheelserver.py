"""A read-only HTTP server on loopback that serves the wheelhouse to builds.

Builds run with ``--network host`` and install with ``--find-links http://builder-wheelhouse:PORT/``:
the wheels never enter the build context or a layer (a ``COPY`` would keep them in the
image), and no CA bundle or credential is needed inside. The name and port are fixed, so the
RUN lines, and so the build cache, never change between builds; each build maps the name to
its own loopback address (``extra_hosts``), so concurrent builds on one host don't collide.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

from builder.config.errors import UserError


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


#: The name the rendered Dockerfiles use for the wheel server.
HOST = "builder-wheelhouse"


def url(port: int) -> str:
    """The wheel server's URL as the Dockerfiles spell it."""
    return f"http://{HOST}:{port}/"


@contextlib.contextmanager
def serve(directory: Path, port: int) -> Iterator[str]:
    """Serve *directory* on a free loopback address at *port*; yield that address.

    All of 127.0.0.0/8 is loopback on Linux, so each concurrent build gets its own address
    and the same port. Pass ``{HOST: address}`` as the build's extra hosts.

    Example:
        >>> with serve(Path("~/.cache/ml-image-builder/wheels").expanduser(), 38611) as address:
        ...     address
        '127.0.0.1'
    """
    handler = functools.partial(_Quiet, directory=str(directory))
    server, last_error = None, None
    for last in range(1, 255):
        try:
            server = http.server.ThreadingHTTPServer((f"127.0.0.{last}", port), handler)
            break
        except OSError as exc:
            last_error = exc
    if server is None:
        raise UserError(
            f"wheel server: port {port} is busy on every 127.0.0.x address ({last_error}); "
            "set wheelhouse_port in matrix.yaml to a free port"
        )
    # A short poll: shutdown() waits up to one poll interval (0.5 s by default) on every build.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="wheel-server",
                              daemon=True)
    thread.start()
    try:
        yield str(server.server_address[0])
    finally:
        server.shutdown()
        server.server_close()
