"""Expiration policies (issue 15) on real tables: the default and "never" policies, updates,
bad values writing nothing, use recorded by pull / ack / the server / the push job, and
maintenance deleting what went unused for its ttl (an injected clock), through the library,
the CLI and the Pub/Sub API server."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from deltabus import PublisherClient, SubscriberClient
from deltabus.errors import InvalidArgument, NotFound
from deltabus.registry import Registry
from deltabus.storage import open_engine
from deltabus.types import DAY, ExpirationPolicy
from tests.conftest import ManualClock, table_versions
from tests.integration.test_cli import run
from tests.server_fixtures import PROJECT, gpub, gsub, serve_thread  # noqa: F401


def _registry(warehouse: str, clock) -> Registry:
    return Registry(open_engine(warehouse, engine="delta-rs", create=False), clock=clock)


def test_default_never_and_updated_policies_and_bad_ones_write_nothing(sub, topic, warehouse) -> None:
    a, b = sub.subscription_path("local", "default-ttl"), sub.subscription_path("local", "never-ttl")
    assert sub.create_subscription(name=a, topic=topic).expiration_policy == ExpirationPolicy(31 * DAY)
    made = sub.create_subscription(request={"name": b, "topic": topic, "expiration_policy": {}})
    assert made.expiration_policy.ttl is None and sub.get_subscription(subscription=b).expiration_policy.ttl is None
    updated = sub.update_subscription(subscription={"name": a, "expiration_policy": {"ttl": dt.timedelta(days=2)}},
                                      update_mask=["expiration_policy"])
    assert updated.expiration_policy.ttl == 2 * DAY == sub.get_subscription(subscription=a).expiration_policy.ttl
    before = table_versions(warehouse)
    with pytest.raises(InvalidArgument, match=r"expiration_policy\.ttl: must be 1\.\.365 days"):
        sub.create_subscription(request={"name": sub.subscription_path("local", "short"), "topic": topic,
                                         "expiration_policy": {"ttl": 3600}})
    with pytest.raises(InvalidArgument, match=r"subscription\.expiration_policy\.ttl|expiration_policy\.ttl"):
        sub.update_subscription(subscription={"name": a, "expiration_policy": {"ttl": 400 * DAY}}, update_mask=["expiration_policy"])
    assert table_versions(warehouse) == before


def test_maintenance_deletes_what_went_unused_for_its_ttl_and_use_keeps_it(pub, topic, warehouse) -> None:
    clock = ManualClock(time.time())
    sub = SubscriberClient(warehouse=warehouse, clock=clock)
    day, used, never, month = (sub.subscription_path("local", n) for n in ("one-day", "used-daily", "never-expires", "default"))
    for name, policy in ((day, {"ttl": DAY}), (used, {"ttl": DAY}), (never, {}), (month, None)):
        request = {"name": name, "topic": topic} | ({} if policy is None else {"expiration_policy": policy})
        sub.create_subscription(request=request)
    pub.publish_batch(topic, [{"data": b"x"}, {"data": b"y"}])
    clock.advance(20 * 3600)
    (got,) = sub.pull(subscription=used, max_messages=1, return_immediately=True).received_messages
    pulled = clock()
    clock.advance(1800)
    sub.acknowledge(subscription=used, ack_ids=[got.ack_id])  # within the hour of the pull: not written again
    clock.advance(24.5 * 3600)  # 45 h: one-day unused since creation; used-daily last used 25 h ago (the pull)
    registry = _registry(warehouse, clock)
    assert registry.subscription(used).last_active.timestamp() == pytest.approx(pulled, abs=1e-3)
    gone = registry.delete_expired(clock())
    assert sorted(r.name for r in gone) == sorted([day, used])
    for name in (day, used):
        with pytest.raises(NotFound):
            sub.get_subscription(subscription=name)
    engine = open_engine(warehouse, engine="delta-rs", create=False)
    uids = {r.sub_uid for r in gone}
    rows = engine.snapshot("deliveries").read(["sub_uid"])
    assert not uids & set(rows["sub_uid"].to_pylist())  # their messages went with them
    clock.advance(40 * DAY)
    assert [r.name for r in registry.delete_expired(clock())] == [month]  # 31 days
    assert sub.get_subscription(subscription=never).expiration_policy.ttl is None
    sub.close()


def test_a_use_recorded_after_the_judgement_keeps_the_subscription(sub, topic, warehouse) -> None:
    clock = ManualClock(time.time())
    name = sub.subscription_path("local", "raced")
    sub.create_subscription(request={"name": name, "topic": topic, "expiration_policy": {"ttl": DAY}})
    clock.advance(2 * DAY)
    registry = _registry(warehouse, clock)
    judged = registry.subscription(name)  # judged expired on this record...
    _registry(warehouse, clock).record_use(judged, clock())  # ...then another process used it
    assert registry._delete_unused(judged) is False
    assert registry.subscription(name).last_active is not None
    assert registry.delete_expired(clock()) == []


def test_the_cli_sets_shows_and_expires(pub, topic, warehouse) -> None:
    run(warehouse, "subscriptions", "create", "kept", "--topic", "orders", "--ttl", "2d")
    assert '"ttl": 172800.0' in run(warehouse, "subscriptions", "get", "kept").stdout
    run(warehouse, "subscriptions", "update", "kept", "--ttl", "never")
    assert '"ttl": null' in run(warehouse, "subscriptions", "get", "kept").stdout
    bad = run(warehouse, "subscriptions", "create", "short", "--topic", "orders", "--ttl", "2h", ok=False)
    assert bad.returncode != 0 and "--ttl: must be 1..365 days" in bad.stderr
    assert "must be 'never' or a duration" in run(warehouse, "subscriptions", "create", "x", "--topic", "orders", "--ttl", "soon", ok=False).stderr
    # Created three days ago with a one-day ttl, never used: `deltabus maintenance` deletes it.
    old = SubscriberClient(warehouse=warehouse, clock=lambda: time.time() - 3 * DAY)
    old.create_subscription(request={"name": "projects/cli/subscriptions/stale", "topic": "projects/cli/topics/orders",
                                     "expiration_policy": {"ttl": DAY}})
    old.close()
    out = run(warehouse, "maintenance").stdout
    assert "deleted expired subscription projects/cli/subscriptions/stale (unused for over 1 day)" in out
    assert "kept" in run(warehouse, "subscriptions", "list").stdout


@pytest.fixture
def topic(pub: PublisherClient) -> str:
    # The CLI's project is "cli" (tests.integration.test_cli.run); the library tests use it too.
    name = pub.topic_path("cli", "orders")
    pub.create_topic(name=name)
    return name


def test_the_server_shows_takes_and_records_use(gpub, gsub, warehouse) -> None:
    from google.pubsub_v1 import types as pb

    t, s = f"projects/{PROJECT}/topics/orders", f"projects/{PROJECT}/subscriptions/orders-sub"
    gpub.create_topic(name=t)
    made = gsub.create_subscription(request={"name": s, "topic": t, "expiration_policy": {"ttl": dt.timedelta(days=3)}})
    assert made.expiration_policy.ttl == dt.timedelta(days=3)
    never = gsub.create_subscription(request={"name": s + "-never", "topic": t, "expiration_policy": {}})
    assert never.expiration_policy == pb.ExpirationPolicy()  # set, with no ttl: never
    assert gsub.get_subscription(subscription=s + "-never").expiration_policy == pb.ExpirationPolicy()
    default = gsub.create_subscription(request={"name": s + "-default", "topic": t})
    assert default.expiration_policy.ttl == dt.timedelta(days=31)
    gpub.publish(t, b"x").result(timeout=30)
    got = gsub.pull(request={"subscription": s, "max_messages": 1}, timeout=30)
    assert len(got.received_messages) == 1
    assert _registry(warehouse, time.time).subscription(s).last_active is not None  # the round recorded the use


def test_an_upgraded_subscription_is_not_expired_by_its_age_and_an_update_saves_it(sub, topic, warehouse) -> None:
    """A row written before expiration policies has no recorded use: maintenance starts its
    clock instead of judging it by its creation time (an upgrade must not delete a busy
    subscription). And a ttl raised after the judgement keeps the subscription."""
    from deltalake import DeltaTable

    clock = ManualClock(time.time())
    old, raised = sub.subscription_path("local", "from-v3"), sub.subscription_path("local", "raised")
    sub.create_subscription(name=old, topic=topic)
    sub.create_subscription(request={"name": raised, "topic": topic, "expiration_policy": {"ttl": DAY}})
    # What the v4 migration leaves on an old row: no policy, no recorded use.
    DeltaTable(f"{warehouse}/subscriptions").update(
        {"last_active": "NULL", "expiration_policy": "NULL"}, predicate=f"name = '{old}'")
    clock.advance(40 * DAY)
    registry = _registry(warehouse, clock)
    judged = registry.subscription(raised)
    sub.update_subscription(subscription={"name": raised, "expiration_policy": {}}, update_mask=["expiration_policy"])
    assert registry._delete_unused(judged) is False  # judged on the old ttl: the update wins
    assert registry.delete_expired(clock()) == []
    assert registry.subscription(old).last_active.timestamp() == pytest.approx(clock(), abs=1e-3)  # its clock started
    clock.advance(32 * DAY)
    assert [r.name for r in registry.delete_expired(clock())] == [old]  # unused 32 days since the upgrade
