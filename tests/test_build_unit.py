"""The build without an engine: the plan (pure), the reuse decision (pure), the executor's stages
on a recording stand-in of :class:`builder.oci.engine.Engine` (tests/doubles.py: mypy checks it against
the Protocol), and publish.record's locking."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import docker
import pytest
from click.testing import CliRunner
from doubles import NoEngine, Silent
from helpers import bare_build_project, fake_view, fetch_wheels

from builder.config.errors import TargetFailed
from builder.config.ownership import clone_id, run_token
from builder.config.project import Project, Target, TargetView, load_project
from builder.gc import owned
from builder.images import build, publish
from builder.images import plan as plans
from builder.images.execute import Attester, Executor, SmokeTest
from builder.oci import registry
from builder.oci.engine import BuildRequest, BuildResult, CacheRecord, Engine, EngineError, ImageFacts
from builder.wheels.lockfile import Pin
from devtools.support import REPO


@pytest.fixture
def slow_writes(monkeypatch):
    """Widen record()'s read-change-write window: a lost update becomes near certain without a lock."""
    write = publish.atomic_write

    def slow(path: Path, text: str) -> None:
        time.sleep(0.02)
        write(path, text)

    monkeypatch.setattr(publish, "atomic_write", slow)


def _record(root: Path, name: str) -> None:
    publish.record(root, [{"target": name, "digest": "sha256:" + name}])


def test_record_keeps_every_thread_s_record(tmp_path, slow_writes):
    names = [f"t{i}" for i in range(12)]
    threads = [threading.Thread(target=_record, args=(tmp_path, n)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(json.loads((tmp_path / "dist/published.json").read_text())) == sorted(names)


def test_record_keeps_every_process_s_record(tmp_path, slow_writes):
    fork = multiprocessing.get_context("fork")  # the children keep the slow writes
    names = [f"p{i}" for i in range(8)]
    procs = [fork.Process(target=_record, args=(tmp_path, n)) for n in names]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0] * len(procs)
    assert sorted(json.loads((tmp_path / "dist/published.json").read_text())) == sorted(names)


# -- the plan and the decision: pure ----------------------------------------------------------------


@pytest.fixture(scope="module")
def project():
    return load_project(REPO / "matrix.yaml")


LABELS = {plans.REVISION: "abc", plans.CREATED: "2025-01-02T03:04:05+00:00"}


def test_the_plan_of_a_view_has_its_refs_build_arguments_and_stages(project):
    cpu = project.target("cpu").default_view
    (view,) = plans.make_plan(project, [cpu], plans.Options(push=True, sign=True), labels=LABELS).views
    assert view.stages == ("build", "smoke", "tag", "push", "attest", "record")
    assert view.content_tag.startswith("localhost:5000/ml-runtime:cpu-")
    assert view.local_refs == tuple(cpu.local_refs) and view.push_refs[-1] == "localhost:5000/ml-runtime:latest-cpu"
    assert view.cache_sources == (plans.cache_ref(cpu), cpu.local_refs[0])
    args = view.request.build_args
    assert args["BASE"] == project.base_for(cpu.platform) and args["SOURCE_DATE_EPOCH"] == "1735787045"
    assert view.request.labels == LABELS and view.request.cache_to == ("type=inline",)  # a push, no registry cache
    folder = plans.wheels_folder(view.wheels)  # staged by the build
    assert view.request.contexts == {f"wheels-{layer}": str(folder / layer) for layer in view.wheels}
    cached = plans.make_plan(project, [cpu], plans.Options(push=True, registry_cache=True), labels=LABELS).views[0]
    # the registry cache alone: the inline record's creation times would make the published digest unique
    assert cached.request.cache_to == (plans.registry_cache_sink(cpu),)
    # not pushed: no record, so the same commit gives the same image ID anywhere (verify --rebuild builds this)
    rebuilt = plans.make_plan(project, [cpu], plans.Options(rebuild=True), labels=LABELS).views[0]
    assert rebuilt.request.cache_to == () and rebuilt.request.no_cache
    assert plans.make_plan(project, [cpu], plans.Options(), labels=LABELS).views[0].request.cache_to == ()


def test_the_plan_is_what_print_shows(project):
    from builder.cli.images import print_cmd

    out = CliRunner().invoke(print_cmd, ["--matrix", str(REPO / "matrix.yaml"), "-t", "nvidia-cu130"])
    assert out.exit_code == 0, out.output
    (target,) = json.loads(out.output)["targets"]
    assert set(target["plan"]) == set(target["content_tags"]) == set(target["layers"])  # the old keys stay
    arm = target["plan"]["linux/arm64"]
    assert arm["content_tag"] == target["content_tags"]["linux/arm64"]
    # its platform tags: the target's own tags become the index
    assert arm["push_refs"][0] == "localhost:5000/ml-runtime:nvidia-cu130-arm64"
    assert all(ref.endswith("-arm64") for ref in arm["push_refs"])
    assert arm["stages"] == ["build", "smoke", "tag"] and "WHEELS_TORCH" in arm["build_args"]


def test_a_multi_platform_target_gets_an_index_plan_with_push_only(project):
    views = project.target("nvidia-cu130").views()
    (index,) = plans.make_plan(project, views, plans.Options(push=True), labels=LABELS).indexes
    assert index.refs[0] == "localhost:5000/ml-runtime:nvidia-cu130" and index.stages == ("index", "record")
    assert plans.make_plan(project, views, plans.Options(), labels=LABELS).indexes == ()


def _plan(name: str = "t0", options: plans.Options | None = None, **fields: Any) -> plans.ViewPlan:
    """A hand-made plan of a fake view (no project behind it)."""
    view = fake_view(name, dockerfile=f"images/{name}/Dockerfile", **fields)
    return plans.ViewPlan(view=view, content_tag=f"127.0.0.1:1/fake:{name}-0", local_refs=tuple(view.local_refs),
                          push_refs=tuple(view.refs), cache_sources=(), registry_host="127.0.0.1:1", wheels={},
                          request=BuildRequest(dockerfile=view.dockerfile, context=".", platform=view.platform),
                          stages=plans.build_stages(options or plans.Options()))


@pytest.mark.parametrize(("presence", "options", "result", "stages"), [
    (None, plans.Options(), "built", ("build", "smoke", "tag")),
    (plans.Presence(), plans.Options(push=True), "built", ("build", "smoke", "tag", "push", "record")),
    (plans.Presence(local_id="sha256:a"), plans.Options(), "reused-local", ("tag",)),
    (plans.Presence(local_id="sha256:a"), plans.Options(push=True, sign=True), "reused-local",
     ("tag", "push", "attest", "record")),
    (plans.Presence(registry_digest="sha256:d", registry_tested=True), plans.Options(), "reused-registry", ()),
    (plans.Presence(registry_digest="sha256:d", registry_tested=True), plans.Options(push=True), "reused-registry",
     ("copy-tags", "record")),
    (plans.Presence(registry_digest="sha256:d", registry_tested=True), plans.Options(pull=True, push=True),
     "reused-registry", ("pull", "tag", "push", "record")),
    # Found under the content tag, but on a digest neither recorded as smoke-tested nor signed: built again.
    (plans.Presence(registry_digest="sha256:d"), plans.Options(push=True, sign=True), "built",
     ("build", "smoke", "tag", "push", "attest", "record")),
    (plans.Presence(error="registry refused"), plans.Options(), None, ()),
])
def test_the_reuse_decision(presence, options, result, stages):
    decision = plans.decide(_plan(options=options), presence, options)
    assert (decision.result, decision.stages) == (result, stages)
    untested = presence is not None and presence.registry_digest is not None and not presence.registry_tested
    assert (decision.note or "").endswith("neither smoke-tested by this builder nor signed with your key: "
                                          "building it again") == untested
    assert decision.smoke == ("passed earlier" if result and result.startswith("reused") else "skipped")
    assert decision.error == (presence.error if presence else None)


def test_the_push_decision_pushes_the_content_tag_only_when_tested():
    options = plans.Options(push=True)
    assert plans.decide_push(_plan(), "sha256:a", True, options).smoke == "passed earlier"
    assert plans.decide_push(_plan(), "sha256:a", False, options).smoke == "skipped"
    assert plans.decide_push(_plan(), None, False, options).error == \
        "no local image 127.0.0.1:1/fake:t0; build it first"


# -- the executor, on a recording engine ------------------------------------------------------------


@pytest.fixture(autouse=True)
def private_state(tmp_path, monkeypatch):
    """The ledgers the executor writes (builder.gc.owned) and this run's lease: the test's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


class FakeEngine(NoEngine):
    """Records the calls the executor makes; a build of t<i> takes *seconds*[name] (default 0) and
    fails with TargetFailed("boom") for the names in *fails*, or raises *raises* for t0."""

    def __init__(self, *, seconds: dict[str, float] | None = None, fails: tuple[str, ...] = (),
                 raises: BaseException | None = None, images: dict[str, ImageFacts] | None = None) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.seconds, self.fails, self.raises = seconds or {}, fails, raises
        self.images = dict(images or {})
        self.pushed: list[str] = []
        self._lock = threading.Lock()

    def _call(self, *call: str) -> None:
        with self._lock:
            self.calls.append(call)

    def image(self, ref: str) -> ImageFacts | None:
        self._call("image", ref)
        return self.images.get(ref)

    def build(self, request: BuildRequest, **kw: Any) -> tuple[str, BuildResult]:
        name = request.stage or request.dockerfile.split("/")[1]
        self._call("build", name)
        time.sleep(self.seconds.get(name, 0.0))
        if self.raises is not None and name == "t0":
            raise self.raises
        if name in self.fails:
            raise TargetFailed("boom")
        return f"sha256:{name}", BuildResult((f"sha256:{name}",), 5, 2)

    def tag(self, image: str, ref: str) -> None:
        self._call("tag", ref)
        self.images[ref] = ImageFacts(image, tags=(ref,))

    def size(self, image: str) -> int:
        return 1000

    def labels(self, image: str) -> dict[str, str]:
        return {plans.REVISION: "abc"}

    def push(self, ref: str, compression: str = "gzip") -> str:
        self._call("push", ref)
        self.pushed.append(ref)
        return "sha256:d"

    def repo_digests(self, ref: str) -> list[str]:
        return [f"{registry.Ref.parse(r).name}@sha256:d" for r in self.pushed]

    def pull(self, ref: str, creds: dict[str, str] | None = None, *, platform: str | None = None) -> None:
        self._call("pull", ref)

    def store(self) -> str:
        return "containerd"

    def name(self) -> str:
        return "fake"

    def address(self) -> str:
        return "fake://engine"

    def store_key(self) -> str:
        return self.address()

    def label(self) -> tuple[str, str]:
        return f"Docker engine at {self.address()}", "docker info"

    def build_cache(self) -> list[CacheRecord]:
        return []

    def containers(self, label: str) -> list[str]:
        self._call("containers", label)
        return []

    def container_labels(self, label: str) -> dict[str, dict[str, str]]:
        return {}

    def remove_container(self, container: str) -> None:
        self._call("remove", container)


class Said(Silent):
    """A UI that keeps what the executor says."""

    def __init__(self) -> None:
        self.said: list[str] = []

    def say(self, text: str) -> None:
        self.said.append(text)


def _smoke(status: str = "passed") -> SmokeTest:
    def smoke(engine: Engine, project: Project, view: TargetView, image: str, *,
              log: Callable[[str], None]) -> SimpleNamespace:
        assert isinstance(engine, FakeEngine)
        engine._call("smoke", image)
        return SimpleNamespace(status=status, skipped=[], summary=lambda: f"1 check {status}")
    return smoke


class Attest(Attester):
    """An attester that records what dist/published.json held when it ran."""

    def __init__(self, root: Path, fail: bool = False) -> None:
        self.root, self.fail = root, fail
        self.seen: list[dict[str, Any]] = []

    def image(self, view: TargetView, digest: str, content_tag: str | None) -> dict[str, str]:
        path = root_published(self.root)
        self.seen.append(json.loads(path.read_text()) if path.exists() else {})
        if self.fail:
            raise TargetFailed("attaching the SBOM, provenance and signature failed: no cosign")
        return {"sig": "sha256:s"}

    def index(self, target: Target, digest: str) -> dict[str, str]:
        return {"sig": "sha256:i"}


def root_published(root: Path) -> Path:
    return root / "dist" / "published.json"


def _executor(engine: Engine, tmp_path: Path, options: plans.Options, **kw: Any) -> Executor:
    project = cast(Project, SimpleNamespace(root=tmp_path))  # a stand-in: the executor reads only its root
    return Executor(engine, project, Silent(), options=options, smoke=kw.pop("smoke", _smoke()), revision="abc", **kw)


def test_a_build_runs_its_stages_in_order_and_records_once(tmp_path):
    options = plans.Options(push=True, sign=True)
    engine, attest, plan = FakeEngine(), Attest(tmp_path), _plan(options=options)
    out = _executor(engine, tmp_path, options, attest=attest).run_view(plan, plans.decide(plan, None, options))
    assert out.error is None and out.result == "built" and out.smoke == "passed" and out.digest == "sha256:d"
    assert [c for c in engine.calls if c[0] != "image"] == [
        ("build", "t0"), ("smoke", "sha256:t0"), ("tag", plan.content_tag), ("tag", "127.0.0.1:1/fake:t0"),
        ("push", plan.content_tag), ("push", "127.0.0.1:1/fake:t0")]
    assert attest.seen == [{}], "attest runs before the record is written: one write, with the attachments"
    record = json.loads(root_published(tmp_path).read_text())["t0"]
    assert record["attachments"] == {"sig": "sha256:s"} and record["content_tag"] == plan.content_tag
    assert record["tags"] == [plan.content_tag, "127.0.0.1:1/fake:t0"] and record["current_revision"] == "abc"


def test_a_built_image_is_recorded_held_by_its_run_until_its_stages_end(tmp_path):
    """builder.gc.owned's ledger, as the executor writes it: held (this run's lease, and the target's
    build hold) while the build and the smoke test run, released with its tags once tagged; a reused
    image is recorded too (how images built before the ledger are adopted)."""
    seen: list[tuple[list[str], set[str]]] = []

    def smoke(engine: Engine, project: Project, view: TargetView, image: str, *,
              log: Callable[[str], None]) -> SimpleNamespace:
        records = owned.images_ledger(engine).records()
        seen.append((records[image].runs, owned.building_targets(records)))
        return SimpleNamespace(status="passed", skipped=[], summary=lambda: "passed")

    engine, plan = FakeEngine(), _plan()
    out = _executor(engine, tmp_path, plans.Options(), smoke=smoke).run_view(plan, plans.decide(plan, None, plans.Options()))
    assert out.error is None
    assert seen == [([run_token()], set())], "held by this run during the smoke test (the build hold ends with the build)"
    record = owned.images_ledger(engine).records()["sha256:t0"]
    assert record.runs == [] and record.facts == {"target": "t0", "tags": sorted([plan.content_tag, "127.0.0.1:1/fake:t0"])}
    assert list(record.clones) == [clone_id(tmp_path)]
    assert not owned.building_targets(owned.images_ledger(engine).records())

    presence = plans.Presence(local_id="sha256:old", local_tags=(plan.content_tag, "127.0.0.1:1/fake:t0"))
    _executor(engine, tmp_path, plans.Options()).run_view(plan, plans.decide(plan, presence, plans.Options()))
    assert owned.images_ledger(engine).records()["sha256:old"].facts["target"] == "t0"


class LoadRefusedEngine(FakeEngine):
    """Its builds read image contexts in place, and it refuses every load (as a full image store
    does); it keeps the contexts each build was given."""

    def __init__(self) -> None:
        super().__init__()
        self.contexts: list[dict[str, str]] = []
        self.early: list[tuple[str, ...]] = []

    def serves_image_contexts(self, builder: str | None) -> bool:
        return True

    def load(self, archive: Path | Iterable[bytes]) -> None:
        raise EngineError("write /var/lib/containerd/...: no space left on device")

    def build(self, request: BuildRequest, **kw: Any) -> tuple[str, BuildResult]:
        self.contexts.append(dict(request.contexts))
        self.early.append(request.early_stages)
        return super().build(request, **kw)


def test_wheels_the_engine_did_not_load_as_images_reach_the_build_as_folders(tmp_path, monkeypatch):
    monkeypatch.setenv("BUILDER_WHEELHOUSE", str(tmp_path / "house"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "state"))
    (tmp_path / "house").mkdir()
    payload = b"a wheel" * 100
    pin = Pin("zz", "1.0", hashlib.sha256(payload).hexdigest(), "zz-1.0-py3-none-any.whl")
    fetch_wheels({pin.filename: payload})
    wheels = {"torch": [pin]}
    base = _plan()
    plan = dataclasses.replace(base, wheels=wheels, request=dataclasses.replace(
        base.request, contexts=plans.wheel_contexts(wheels), early_stages=("wheel-layer-torch",)))
    engine, ui = LoadRefusedEngine(), Said()
    executor = Executor(engine, cast(Project, SimpleNamespace(root=tmp_path)), ui, options=plans.Options(),
                        smoke=_smoke(), revision="abc")
    out = executor.run_view(plan, plans.decide(plan, None, plans.Options()))
    assert out.error is None and out.result == "built"
    assert engine.contexts == [plans.wheel_contexts(wheels)], "the build reads the staged folders"
    assert engine.early == [()], "no early export: each would send the folders once more"
    assert (Path(engine.contexts[0]["wheels-torch"]) / pin.filename).read_bytes() == payload
    assert any("did not load the wheels as images (write /var/lib/containerd/...: no space left on device); "
               "this build sends their folders instead" in line for line in ui.said), ui.said


class RacedEngine(FakeEngine):
    """Its first build fails as the containerd store fails when another build exports the same image."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error
        self.requests: list[BuildRequest] = []

    def build(self, request: BuildRequest, **kw: Any) -> tuple[str, BuildResult]:
        self.requests.append(request)
        if len(self.requests) == 1:
            raise TargetFailed(self.error)
        return super().build(request, **kw)


def test_an_image_another_build_exported_at_the_same_moment_is_exported_again(tmp_path):
    """Two runs at once: one export is refused (moby/moby#46990); that build runs once more, from the
    layers just built, and says so; any other failure is the view's error, with no second try."""
    options = plans.Options(rebuild=True)
    plan = _plan(options=options)
    plan = dataclasses.replace(plan, request=dataclasses.replace(plan.request, no_cache=True))  # --rebuild
    engine = RacedEngine('failed to solve: image "moby-dangling@sha256:cadd": already exists')
    executor = _executor(engine, tmp_path, options)
    executor.ui = ui = Said()
    out = executor.run_view(plan, plans.decide(plan, None, options))
    assert out.error is None and out.result == "built" and len(engine.requests) == 2
    assert engine.requests[0].no_cache and not engine.requests[1].no_cache
    (line,) = [s for s in ui.said if "already exists" in s]
    assert line.startswith("t0: image \"moby-dangling@sha256:cadd\": already exists: another build exported")
    engine = RacedEngine("failed to solve: process did not complete successfully: exit code: 1")
    out = _executor(engine, tmp_path, options).run_view(plan, plans.decide(plan, None, options))
    assert out.error and len(engine.requests) == 1


class TagRacedEngine(FakeEngine):
    """Its first tag of each name fails as the containerd store fails when another build tags it too."""

    def tag(self, image: str, ref: str) -> None:
        if ("refused", ref) not in self.calls:
            self._call("refused", ref)
            super().tag(image, ref)  # the other build's tag, of the same image
            raise docker.errors.APIError(f"failed to create an image {ref} with target {image} after deleting "
                                         f"the existing one: image \"{ref}\": already exists")
        super().tag(image, ref)


def test_a_name_another_build_tagged_at_the_same_moment_is_no_failure(tmp_path):
    engine, plan = TagRacedEngine(), _plan()
    out = _executor(engine, tmp_path, plans.Options()).run_view(plan, plans.decide(plan, None, plans.Options()))
    assert out.error is None and engine.images[plan.content_tag].id == "sha256:t0"


def test_a_failed_smoke_test_moves_no_tag(tmp_path):
    engine, plan = FakeEngine(), _plan()
    out = _executor(engine, tmp_path, plans.Options(), smoke=_smoke("failed")).run_view(
        plan, plans.decide(plan, None, plans.Options()))
    assert out.error == "smoke test failed: 1 check failed" and not [c for c in engine.calls if c[0] == "tag"]


def test_without_smoke_the_content_tag_is_neither_tagged_nor_pushed(tmp_path):
    options = plans.Options(push=True, smoke=False)
    engine, plan = FakeEngine(), _plan(options=options)
    out = _executor(engine, tmp_path, options).run_view(plan, plans.decide(plan, None, options))
    assert out.smoke == "skipped" and plan.content_tag not in [c[1] for c in engine.calls if c[0] in ("tag", "push")]


def test_a_failed_attest_keeps_the_record_of_what_was_pushed(tmp_path):
    options = plans.Options(push=True, sign=True)
    engine, plan = FakeEngine(), _plan(options=options)
    out = _executor(engine, tmp_path, options, attest=Attest(tmp_path, fail=True)).run_view(
        plan, plans.decide(plan, None, options))
    assert out.error == "attaching the SBOM, provenance and signature failed: no cosign"
    record = json.loads(root_published(tmp_path).read_text())["t0"]
    assert record["digest"] == "sha256:d" and "attachments" not in record


def test_a_local_reuse_moves_only_the_missing_tags(tmp_path):
    options = plans.Options()
    engine, plan = FakeEngine(), _plan()
    presence = plans.Presence(local_id="sha256:old", local_tags=("127.0.0.1:1/fake:t0",))
    out = _executor(engine, tmp_path, options).run_view(plan, plans.decide(plan, presence, options))
    assert (out.result, out.image_id, out.smoke, out.tags) == ("reused-local", "sha256:old", "passed earlier", ["t0"])
    assert not [c for c in engine.calls if c[0] in ("build", "smoke", "tag", "push")]
    assert not root_published(tmp_path).exists()


def _run_all(tmp_path, *, jobs: int, keep_going: bool, raises: BaseException | None = None):
    """Six views: t0 fails after 0.1 s (or raises *raises*), the others take 0.3 s each."""
    engine = FakeEngine(seconds={"t0": 0.1, **{f"t{i}": 0.3 for i in range(1, 6)}}, fails=("t0",), raises=raises)
    work = [(p, plans.decide(p, None, plans.Options(smoke=False))) for p in
            (_plan(f"t{i}", plans.Options(smoke=False)) for i in range(6))]
    outcomes = _executor(engine, tmp_path, plans.Options(smoke=False)).run(
        work, keep_going=keep_going, jobs=jobs, shared=work[0][0])
    return [c[1] for c in engine.calls if c[0] == "build"], outcomes


@pytest.mark.parametrize("jobs", [1, 3])
def test_without_keep_going_no_target_starts_after_a_failure(tmp_path, jobs):
    started, outcomes = _run_all(tmp_path, jobs=jobs, keep_going=False)
    # -j 3: the shared stage once first; t0 fails first, t1 and t2 had started beside it and finish.
    running = [f"t{i}" for i in range(jobs)]
    assert started[: 1 if jobs > 1 else 0] == (["common"] if jobs > 1 else [])
    assert sorted(b for b in started if b != "common") == running
    assert [o.target for o in outcomes] == running and outcomes[0].error == "boom"


@pytest.mark.parametrize("jobs", [1, 3])
def test_keep_going_runs_every_target(tmp_path, jobs):
    started, outcomes = _run_all(tmp_path, jobs=jobs, keep_going=True)
    assert sorted(b for b in started if b != "common") == [f"t{i}" for i in range(6)]
    assert [o.target for o in outcomes] == [f"t{i}" for i in range(6)]


@pytest.mark.parametrize("jobs", [1, 3])
def test_an_exception_in_one_build_is_its_outcome_and_the_others_finish(tmp_path, jobs):
    """The engine's transport error in one build (-j N: re-raised from f.result()) is one line in its outcome."""
    import requests.exceptions

    _started, outcomes = _run_all(tmp_path, jobs=jobs, keep_going=True,
                                  raises=requests.exceptions.ReadTimeout("read timed out"))
    assert [o.target for o in outcomes] == [f"t{i}" for i in range(6)]
    assert "Docker engine at" in (outcomes[0].error or "") and "ReadTimeout" in (outcomes[0].error or "")
    assert outcomes[1].error is None


def test_ctrl_c_cancels_and_removes_this_run_s_smoke_containers(tmp_path):
    engine = FakeEngine(raises=KeyboardInterrupt())
    executor = _executor(engine, tmp_path, plans.Options())
    with pytest.raises(KeyboardInterrupt):
        executor.run([(p, plans.decide(p, None, plans.Options())) for p in (_plan("t0"), _plan("t1"))],
                     keep_going=True)
    assert executor.cancel.is_set()
    assert engine.calls[-1][0] == "containers" and ("build", "t1") not in engine.calls


@pytest.mark.parametrize("keep_going", [False, True])
def test_a_foreign_platform_without_emulation_fails_with_the_fix(monkeypatch, tmp_path, keep_going):
    """The emulation check runs before any wheel is fetched; the native targets build only with -k."""
    project = bare_build_project(monkeypatch, tmp_path)
    monkeypatch.setattr(build.platforms, "emulation_problem",  # stands in for a host without qemu's handler
                        lambda platform: None if platform == "linux/native" else f"{platform} needs emulation: FIX")
    native = fake_view("native", dockerfile="images/native/Dockerfile", platform="linux/native")
    foreign = fake_view("foreign", dockerfile="images/foreign/Dockerfile", platform="linux/other")
    engine = FakeEngine()
    outcomes = build.build_all(engine, project, [foreign, native], Silent(), keep_going=keep_going, smoke=False)
    failed = next(o for o in outcomes if o.target == "foreign")
    assert failed.error == "linux/other needs emulation: FIX" and failed.platform == "linux/other"
    assert [c[1] for c in engine.calls if c[0] == "build"] == (["native"] if keep_going else [])
