"""The one way to the base (:func:`builder.base.pin.get`): what each need takes as it is, and when it
settles the base; whether a base is local is asked one way (:func:`builder.base.pin.local`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from doubles import NoEngine

from builder.base import pin
from builder.config.baselock import PinnedBase, read_base_lock
from builder.config.errors import UserError
from builder.config.project import load_project

PLATFORM = "linux/amd64"


def _settled(calls: list[str]) -> object:
    def settle(engine: object, project: object, platform: str, **how: object) -> PinnedBase:
        calls.append(platform)
        return PinnedBase(reference="localhost:5000/ml-runtime/base@sha256:" + "1" * 64, image_id="sha256:" + "2" * 64)
    return settle


def test_get_takes_the_base_as_it_is_where_the_need_is_met(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = load_project(project / "matrix.yaml")
    pinned = read_base_lock(p.root).platforms[PLATFORM].reference  # type: ignore[union-attr]
    calls: list[str] = []
    monkeypatch.setattr(pin, "_settle", _settled(calls))
    monkeypatch.setattr(pin, "local", lambda engine, ref: ref == pinned)
    monkeypatch.setattr(pin, "_in_registry", lambda ref: pytest.fail("a local base is not looked up in the registry"))
    said: list[str] = []
    for need in ("pinned", "local"):
        assert pin.get(NoEngine(), p, PLATFORM, need=need, update=False, say=said.append) == pinned
    assert calls == [] and said == []
    pin.get(NoEngine(), p, PLATFORM, need="published", update=False, say=said.append)  # always settled
    assert calls == [PLATFORM]


def test_get_settles_a_base_that_is_not_where_the_need_asks(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = load_project(project / "matrix.yaml")
    calls: list[str] = []
    monkeypatch.setattr(pin, "_settle", _settled(calls))
    monkeypatch.setattr(pin, "local", lambda engine, ref: False)
    monkeypatch.setattr(pin, "_in_registry", lambda ref: True)
    said: list[str] = []
    # Pinned: in the registry is enough (a build pulls it when a view builds).
    assert pin.get(NoEngine(), p, PLATFORM, need="pinned", update=False, say=said.append) == p.base_for(PLATFORM)
    assert calls == []
    # Local: fetched, and said.
    got = pin.get(NoEngine(), p, PLATFORM, need="local", update=False, say=said.append)
    assert calls == [PLATFORM] and got.endswith("1" * 64)
    assert said == [f"base {p.base_for(PLATFORM)} ({PLATFORM}) is not local: fetching it"]
    # Pinned, in neither: settled (bootstrapped and pinned there, with --update-base where the mirror moved).
    monkeypatch.setattr(pin, "_in_registry", lambda ref: False)
    pin.get(NoEngine(), p, PLATFORM, need="pinned", update=False, say=said.append)
    assert calls == [PLATFORM, PLATFORM]


def test_get_pinned_refuses_a_lock_without_the_platform_unless_it_may_update(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = load_project(project / "matrix.yaml")
    (project / "base.lock.json").unlink()
    calls: list[str] = []
    monkeypatch.setattr(pin, "_settle", _settled(calls))
    with pytest.raises(UserError, match="builder base --platform"):
        pin.get(NoEngine(), p, PLATFORM, need="pinned", update=False, say=print)
    assert calls == []
    pin.get(NoEngine(), p, PLATFORM, need="pinned", update=True, say=print)
    assert calls == [PLATFORM]
