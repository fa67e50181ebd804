"""When the push job rewrites the backlog table, and the push figures its rows carry."""

import time

from deltalake import DeltaTable

from deltabus.push.backlog_refresher import BacklogRefresher
from deltabus.push.outcome_ledger import OutcomeLedger
from deltabus.registry import Registry
from deltabus.storage import open_engine
from tests.conftest import ManualClock


class Timer:
    """A monotonic timer each refresh advances by `cost` seconds."""

    def __init__(self, cost: float) -> None:
        self.t, self.cost, self.calls = 0.0, cost, 0

    def __call__(self) -> float:
        self.calls += 1
        if self.calls % 2 == 0:  # the end of a refresh
            self.t += self.cost
        return self.t


def setup(pub, psub, topic, warehouse, cost=0.01):
    push = psub.subscription_path("local", "push")
    pull = psub.subscription_path("local", "pull")
    psub.create_subscription(name=push, topic=topic, push_config={"push_endpoint": "http://127.0.0.1:9/push"})
    psub.create_subscription(name=pull, topic=topic)
    pub.publish_batch(topic, [{"data": b"x"}] * 3)
    engine = open_engine(warehouse, create=False)
    registry = Registry(engine, clock=time.time)
    clock = ManualClock(time.time())
    book = OutcomeLedger(registry.subscriptions, clock=clock, rand=lambda: 0.5)
    refresher = BacklogRefresher(engine, registry.subscriptions, interval=1.0, clock=clock, timer=Timer(cost))
    recs = registry.subscriptions()
    return refresher, book, clock, {recs[push].sub_uid: recs[push]}, push, pull


def test_push_rows_carry_the_jobs_figures_and_the_total_counts_push_subscriptions_only(pub, psub, topic, warehouse):
    refresher, book, clock, subs, push, pull = setup(pub, psub, topic, warehouse)
    [uid] = subs
    book.pushed(uid, ["a", "b"], at=clock())
    assert refresher.refresh(subs, book) and refresher.fresh
    assert refresher.total == 3 and not refresher.nothing_left
    rows = {r["subscription"]: r for r in DeltaTable(f"{warehouse}/backlog").to_pyarrow_table().to_pylist()}
    assert rows[push]["delivered"] == 2 and rows[push]["push_window"] == book.state(uid).window.limit
    assert rows[pull]["delivered"] is None and rows[pull]["num_undelivered_messages"] == 3


def test_refreshes_wait_for_the_interval_or_ten_times_their_cost_unless_forced(pub, psub, topic, warehouse):
    refresher, book, clock, subs, _, _ = setup(pub, psub, topic, warehouse, cost=0.5)
    assert refresher.refresh(subs, book)
    clock.advance(0.9)
    assert not refresher.refresh(subs, book) and not refresher.fresh and not refresher.nothing_left
    clock.advance(0.2)  # past the 1 s interval, but the last refresh cost 0.5 s: wait 5 s
    assert not refresher.refresh(subs, book)
    clock.advance(4.0)
    assert refresher.refresh(subs, book)
    assert refresher.refresh(subs, book, force=True) and refresher.fresh
