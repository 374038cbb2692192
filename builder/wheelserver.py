"""A read-only HTTP server on loopback that serves the wheelhouse to builds.

Builds run with ``--network host`` and install with ``--find-links http://127.0.0.1:PORT/``:
the wheels never enter the build context or a layer (a ``COPY`` would keep them in the
image), and no CA bundle or credential is needed inside. The port is fixed per matrix so
the RUN lines, and so the build cache, never change between builds.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

from builder.errors import UserError


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass


@contextlib.contextmanager
def serve(directory: Path, port: int) -> Iterator[str]:
    """Serve *directory* on 127.0.0.1:*port* for the duration of the block; yield its URL.

    Example:
        >>> with serve(Path("~/.cache/ml-image-builder/wheels").expanduser(), 38611) as url:
        ...     url
        'http://127.0.0.1:38611/'
    """
    handler = functools.partial(_Quiet, directory=str(directory))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as exc:
        raise UserError(
            f"wheel server: 127.0.0.1:{port} is busy ({exc.strerror}); another 'builder build' may be running, "
            "or set wheelhouse_port in matrix.yaml to a free port"
        ) from None
    thread = threading.Thread(target=server.serve_forever, name="wheel-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.shutdown()
        server.server_close()
