"""The log a person reads in CI (``make images ... | cat``): no line wrapped or cut, the summary one
line per row with whole values, and a line at least every heartbeat while a long step is silent.

The output goes to a pipe (a real non-terminal stderr); the slow steps are real subprocesses that
sleep, with a short heartbeat so the tests are fast. mmdebstrap is stood in for by a shell script
that prints its kind of lines (the real one needs minutes and a Debian mirror: tests/engine/test_base.py).
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from builder.base import bootstrap as base
from builder.config.heartbeat import heartbeat
from builder.images.outcome import Outcome
from builder.images.progress import Progress, step_summary, summary_lines

#: The name BuildKit gives the cpu target's install of its common wheels (images/cpu/Dockerfile's RUN,
#: its lines joined and its build argument WHEELS_COMMON expanded, as buildx's progress reports it).
STEP = (Path(__file__).parent / "fixtures" / "buildkit" / "step-common-install.txt").read_text().strip()
DIGEST = "sha256:8e83bcc6d3788e4b44b072ffa1eb630698de81ea46319a9e0e" + "0" * 14
TAGS = [f"registry.example:5443/team/ml-runtime:nvidia-cu130-{'a' * 12}",
        f"registry.example:5443/team/ml-runtime:latest-nvidia-cu130@{DIGEST}"]


def _stderr_of(code: str) -> str:
    """What *code* writes to stderr when stderr is a pipe (as in CI), with rich's usual 80 columns."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          check=True, env={"COLUMNS": "80", "PATH": "/usr/bin:/bin", "TERM": "xterm"})
    return proc.stderr


def test_summary_in_a_log_is_one_line_per_row_with_whole_values() -> None:
    err = _stderr_of(f"""
        from builder.images.outcome import Outcome
        from builder.images.progress import print_summary
        print_summary([Outcome("nvidia-cu130", "linux/amd64", {TAGS!r}, size_bytes=5.4e9, seconds=131.2, steps=12,
                               cached_steps=3, smoke="passed", result="reused-registry"),
                       Outcome("cpu", "linux/arm64", [], error="smoke test failed")])
    """)
    lines = err.splitlines()
    assert "…" not in err
    assert len(lines) == 2, err
    assert all(tag in lines[0] for tag in TAGS)
    assert "nvidia-cu130 platform=linux/amd64 result=reused-registry" in lines[0]
    assert "cpu platform=linux/arm64 result=FAILED" in lines[1]


def test_summary_lines_hold_every_value() -> None:
    (line,) = summary_lines([Outcome("cpu", "linux/amd64", TAGS, seconds=2.0, result="built")])
    assert line.endswith(",".join(TAGS)) and "…" not in line


def test_build_log_lines_are_never_wrapped_in_a_log() -> None:
    long = f"#7 exporting manifest {DIGEST} done; docker buildx build --progress=rawjson " + " ".join(["--build-arg X=1"] * 20)
    err = _stderr_of(f"""
        from builder.images.progress import Progress
        with Progress() as ui:
            ui.start("nvidia-cu130")
            ui.log("nvidia-cu130", {long!r})
            ui.say({long!r})
    """)
    lines = err.splitlines()
    assert f"nvidia-cu130 | {long}" in lines
    assert long in lines
    assert "…" not in err


class _Clock:
    """A writable stream that stamps every line it is given."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []

    def __call__(self, text: str) -> None:
        self.lines.append((time.monotonic(), text))

    def gaps(self, start: float, end: float) -> list[float]:
        stamps = [start, *(t for t, _ in self.lines), end]
        return [b - a for a, b in itertools.pairwise(stamps)]


def test_heartbeat_says_what_a_slow_step_does_within_each_interval() -> None:
    said = _Clock()
    start = time.monotonic()
    with heartbeat(lambda: "downloading: 1 of 2 wheels", interval=0.3, say=said):
        subprocess.run(["sleep", "1.6"], check=True)
    end = time.monotonic()
    assert len(said.lines) >= 4
    assert {text for _, text in said.lines} == {"downloading: 1 of 2 wheels"}
    assert max(said.gaps(start, end)) <= 0.3 + 0.25


def test_an_inner_heartbeat_speaks_and_the_outer_says_what_is_left() -> None:
    said = _Clock()
    start = time.monotonic()
    with heartbeat(lambda: "the base: loading it", interval=0.3, say=said):
        with heartbeat(lambda: "bootstrapping: 3 packages unpacked", interval=0.3, say=said):
            subprocess.run(["sleep", "1.0"], check=True)
        subprocess.run(["sleep", "1.0"], check=True)
    end = time.monotonic()
    texts = [text for _, text in said.lines]
    inner = texts.index("the base: loading it")
    assert inner >= 2 and set(texts[:inner]) == {"bootstrapping: 3 packages unpacked"}
    assert set(texts[inner:]) == {"the base: loading it"} and len(texts) - inner >= 2
    assert max(said.gaps(start, end)) <= 0.3 + 0.25


def test_a_silent_build_step_says_it_is_alive(tmp_path: Path) -> None:
    from rich.console import Console

    said = _Clock()

    class Stream:
        def write(self, text: str) -> int:
            for line in text.splitlines():
                said(line)
            return len(text)

        def flush(self) -> None:
            pass

    console = Console(file=Stream(), soft_wrap=True, width=100_000, force_terminal=False)  # type: ignore[arg-type]
    start = time.monotonic()
    with Progress(console=console, heartbeat_s=0.3) as ui:
        ui.start("cpu")
        ui.step("cpu", 3, 4, STEP)
        subprocess.run(["sleep", "1.6"], check=True)
        end = time.monotonic()
        ui.done("cpu", Outcome("cpu"))
    beats = [text for t, text in said.lines if t <= end]
    assert len(beats) >= 3
    assert all(re.fullmatch(r"cpu \| still running: \[common 4/4\] pip install \(27 wheels\) [0-9]+s", b)
               for b in beats), beats
    assert max(said.gaps(start, end)) <= 0.3 + 1.25  # checked every quarter of the interval, at most 1 s


def test_the_heartbeat_names_a_step_in_one_short_line_and_the_log_has_it_whole_once() -> None:
    """The step of the recorded name installs the cpu target's 27 common wheels: 3,268 characters,
    hash locks included. The build log has it once, whole (its own line when it starts); a heartbeat
    names it in about 120 characters, however long it runs."""
    assert len(STEP) > 3000 and STEP.count("--hash=sha256:") == 27
    assert step_summary(STEP) == "[common 4/4] pip install (27 wheels)"
    err = _stderr_of(f"""
        import time
        from builder.images.progress import Progress
        with Progress(heartbeat_s=0.2) as ui:
            ui.start("nvidia-cu130 (linux/arm64)")
            ui.log("nvidia-cu130 (linux/arm64)", "#4 " + " ".join({STEP!r}.split()))
            ui.step("nvidia-cu130 (linux/arm64)", 3, 4, {STEP!r})
            time.sleep(0.9)
    """)
    whole = [line for line in err.splitlines() if "--hash=sha256:" in line]
    beats = [line for line in err.splitlines() if "still running" in line]
    assert len(whole) == 1 and whole[0].endswith(" ".join(STEP.split()))
    assert beats and all(len(line) <= 120 for line in beats), beats
    assert beats[0].startswith("nvidia-cu130 (linux/arm64) | still running: [common 4/4] pip install (27 wheels) ")


def test_a_step_summary_says_what_installs_and_cuts_the_rest() -> None:
    assert step_summary("[torch 2/3] RUN --network=none uv pip install torch") == "[torch 2/3] pip install torch"
    unexpanded = ("RUN --network=none --mount=type=bind,from=wheels-common,target=/tmp/wheels/common touch /tmp/.layer"
                  " && printf '%s %s\\n' $WHEELS_COMMON > /tmp/common.lock && uv pip install -r /tmp/common.lock")
    assert step_summary(unexpanded) == "pip install (the common layer's wheels)"  # podman's step: not expanded
    long = "[runtime 3/5] RUN --network=none --mount=type=tmpfs,target=/tmp python -m compileall -q " + "x" * 200
    assert step_summary(long) == "[runtime 3/5] RUN python -m compileall -q " + "x" * 29 + "…"  # 72 characters
    assert step_summary("[common 3/4] WORKDIR /workspace") == "[common 3/4] WORKDIR /workspace"
    assert step_summary("exporting to image") == "exporting to image"


def test_the_bootstrap_says_packages_and_stage(tmp_path: Path, capsys) -> None:
    """A stand-in for mmdebstrap: a script that prints its stage and dpkg's lines, then sleeps."""
    fake = tmp_path / "mmdebstrap"
    fake.write_text("#!/bin/sh\necho 'I: installing essential packages...'\n"
                    "echo 'Unpacking libc6:arm64 (2.36-9) ...'\necho 'Unpacking bash:arm64 (5.2) ...'\n"
                    "sleep 1.3\necho 'I: creating tarball...'\nsleep 0.8\nexit 3\n")
    fake.chmod(0o755)
    code, output = base._run_mmdebstrap([str(fake)], {"PATH": "/usr/bin:/bin"}, "linux/arm64", heartbeat_s=0.4)
    err = capsys.readouterr().err.splitlines()
    assert code == 3 and "Unpacking bash" in output
    assert any(line.startswith("bootstrapping linux/arm64: 2 packages unpacked, installing essential packages (")
               for line in err), err
    assert any("2 packages unpacked, creating tarball (" in line for line in err), err


def _wheel(folder: Path, payload: int) -> Path:
    """A small valid wheel with *payload* bytes of incompressible data."""
    import os
    import zipfile

    path = folder / "slowpkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as whl:
        whl.writestr("slowpkg/__init__.py", "")
        whl.writestr("slowpkg/data.bin", os.urandom(payload))
        whl.writestr("slowpkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: slowpkg\nVersion: 1.0\n")
        whl.writestr("slowpkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                     "Tag: py3-none-any\n")
        whl.writestr("slowpkg-1.0.dist-info/RECORD", "")
    return path


def test_the_wheel_download_says_how_far_it_is(tmp_path: Path, capsys) -> None:
    """pip downloads from a real HTTP server on loopback that sends the wheel slowly (a stand-in for
    a large torch wheel from PyPI); the heartbeat counts what pip has written so far."""
    import http.server
    import threading

    from builder.wheels import resolve

    wheel = _wheel(tmp_path, 3_000_000)
    data = wheel.read_bytes()

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.endswith(".whl"):
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                for i in range(0, len(data), len(data) // 10):
                    self.wfile.write(data[i:i + len(data) // 10])
                    self.wfile.flush()
                    time.sleep(0.15)
                return
            page = f'<a href="/{wheel.name}">{wheel.name}</a>'.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        dest = tmp_path / "house"
        proc = resolve._download(["download", "--no-deps", "--no-index", "--find-links",
                                  f"http://127.0.0.1:{server.server_port}/", "-d", str(dest), "slowpkg==1.0"],
                                 {wheel.name: len(data)}, heartbeat_s=0.3)
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stderr
    assert (dest / wheel.name).read_bytes() == data
    beats = [line for line in capsys.readouterr().err.splitlines() if line.startswith("downloading: ")]
    assert len(beats) >= 2, beats
    assert any(b.startswith("downloading: 1 of 1 wheels, ") and b.endswith(" of 0.00 GB") for b in beats), beats
