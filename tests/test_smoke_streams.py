"""The smoke test parses the probe's JSON from stdout only (a stderr warning may land inside it).

The engine is a stand-in that keeps the two streams apart as the engine's log API does (the
real-engine smoke tests are tests/engine; this host's one engine is not ours to use).
"""

from __future__ import annotations

from types import SimpleNamespace

from builder.images import smoke
from builder.oci.docker import DockerAPI, DockerEngine

STDOUT = '[CHECK] pytorch: 2.13.0+cpu -> OK\n{\n  "vendor": "none",\n  "torch": {"version": "2.13.0"}\n}\n'
STDERR = "UserWarning: NumPy is not available\n"
MERGED = STDOUT.replace('  "vendor": "none",\n', '  "vendor": "none",\n' + STDERR)  # as the two arrive


class _Container:
    def start(self) -> None: ...
    def wait(self, timeout: int) -> dict[str, int]: return {"StatusCode": 0}
    def remove(self, force: bool) -> None: ...

    def logs(self, stdout: bool, stderr: bool) -> bytes:
        return (MERGED if stderr else STDOUT).encode() if stdout else STDERR.encode()


def test_probe_json_is_read_from_stdout_even_with_a_warning_inside_the_merged_output():
    client = SimpleNamespace(containers=SimpleNamespace(create=lambda *a, **k: _Container()))
    status, merged, stdout = smoke.run_container(DockerEngine(DockerAPI(client)), "img", smoke.PROBE)
    assert status == 0 and STDERR in merged
    assert smoke._json_after_checks(merged) is None  # what reading both streams gave
    assert smoke._json_after_checks(stdout) == {"vendor": "none", "torch": {"version": "2.13.0"}}
