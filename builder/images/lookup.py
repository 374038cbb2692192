"""What is already there, before anything is decided: the lookups of each view's content tag (in the
engine, else in the registry, and whether the registry's image counts as smoke-tested), the engine's
images ``builder push`` starts from, and the registry cache a build reads.

A lookup that fails is that view's error (:class:`builder.images.plan.Presence`,
:class:`builder.images.plan.Decision`), not the run's; :func:`builder.images.plan.decide` then decides
from the answers alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from builder.config.errors import TargetFailed, UserError
from builder.images import plan as plans
from builder.images import trust
from builder.oci import faults, localregistry, registry
from builder.oci.engine import Engine


def presence(engine: Engine, views: Sequence[plans.ViewPlan],
             vouch: trust.Vouch | None = None) -> dict[str, plans.Presence]:
    """The lookups :func:`~builder.images.plan.decide` needs, per view (unit): its content tag in the
    engine, else in the registry (one manifest request; none when no registry answers: the local
    default, not started) and whether the registry's digest counts as smoke-tested
    (:func:`builder.images.trust.tested`, *vouch* for a signature). A lookup that fails is that
    view's error, not the run's."""
    found: dict[str, plans.Presence] = {}
    up: dict[str, bool] = {}
    for view in views:
        try:
            found[view.unit] = _presence(engine, view.content_tag, up, vouch)
        except (UserError, TargetFailed) as exc:  # e.g. the registry refused the lookup
            found[view.unit] = plans.Presence(error=str(exc))
        except faults.KNOWN as exc:
            found[view.unit] = plans.Presence(error=faults.describe(exc, engine).line)
    return found


def _presence(engine: Engine, ref: str, up: dict[str, bool], vouch: trust.Vouch | None) -> plans.Presence:
    image = engine.image(ref)
    if image is not None:
        return plans.Presence(local_id=image.id, local_tags=image.tags)
    host = registry.Ref.parse(ref).host
    if host not in up:
        up[host] = answers(host)  # once per registry and run
    if not up[host]:
        return plans.Presence()
    digest = registry.manifest_digest(ref, registry.credentials(host))
    tested = digest is not None and trust.tested(ref, digest, vouch)
    return plans.Presence(registry_digest=digest, registry_tested=tested)


def answers(host: str) -> bool:
    """Whether a registry answers on *host*; on loopback, one that passes
    :func:`builder.oci.localregistry.check` (else a UserError: another process holds the port)."""
    if not registry.ping(host, timeout=2.0):
        return False
    if registry.is_local(host):
        localregistry.check(host)
    return True


def push_decisions(engine: Engine, views: Sequence[plans.ViewPlan],
                   options: plans.Options) -> list[tuple[plans.ViewPlan, plans.Decision]]:
    """For ``builder push``: each view with its :func:`~builder.images.plan.decide_push`, from the
    engine's ID of its image and whether its content tag is on that very image (its smoke test
    passed on this content). A lookup that fails is that view's error."""
    work = []
    for view in views:
        try:
            image = engine.image(view.local_refs[0])
            tested = engine.image(view.content_tag) if image is not None else None
            decision = plans.decide_push(view, image.id if image else None,
                                         tested is not None and image is not None and tested.id == image.id,
                                         options)
        except faults.KNOWN as exc:  # the engine failed: name it
            decision = plans.Decision(None, (), error=faults.describe(exc, engine).line)
        work.append((view, decision))
    return work


def registry_cache_source(ref: str) -> list[str]:
    """[*ref*] when the registry has it, [] when it was never published or no registry answers (a cold build).

    Asked before the build, so that a refusal (auth, a rate limit, a registry down) names its cause
    instead of passing for "never published": BuildKit itself only warns and builds cold.
    """
    host = registry.Ref.parse(ref).host
    try:
        if not answers(host):
            return []  # no registry answers (the local default, not started): nothing to read
        published = registry.manifest_digest(ref, registry.credentials(host)) is not None
    except faults.KNOWN as exc:
        raise TargetFailed(f"reading the cache source {ref} failed, not for want of it: "
                           f"{faults.describe(exc).line}") from None
    return [ref] if published else []
