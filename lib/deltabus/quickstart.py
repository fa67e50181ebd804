"""The README's first command: a topic, a pull subscription, publish, pull, ack, backlog.

One engine for the whole run: ``run`` opens the warehouse once on the engine it is given
(``"auto"`` resolved against the session it is handed) and hands that same ``Engine`` to its
clients and to the push job. Before, the clients took DELTABUS_ENGINE/auto and the job its
``Settings`` default, so on a session with the Delta jars the pull demo could run on delta-rs
while the push job ran on delta-spark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from . import AlreadyExists, PublisherClient, SubscriberClient, types
from .config import EngineName
from .storage import Engine, open_engine

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

Say = Callable[[str], None]


def _drain(sub: SubscriberClient, path: str, say: Say) -> int:
    total = 0
    while True:
        got = sub.pull(subscription=path, max_messages=1000, return_immediately=True).received_messages
        if not got:
            return total
        if total == 0:
            r = got[0]
            say(
                f"  first message: id={r.message.message_id} data={r.message.data[:40]!r} "
                f"attributes={dict(r.message.attributes)} attempt={r.delivery_attempt}"
            )
        sub.acknowledge(subscription=path, ack_ids=[r.ack_id for r in got])
        total += len(got)
        say(f"  pulled and acked {len(got)} (total {total})")


def run(
    spark: "SparkSession", warehouse: str, project: str = "quickstart", say: Say = print, *, engine: EngineName = "auto"
) -> dict[str, int]:
    """Run the quickstart on `warehouse` (created if missing) with `engine` ("auto": delta-spark
    when `spark` has the Delta jars, else delta-rs) for every client and the push job; return
    its figures: published, pulled, unacked, pushed, push_acked."""
    store = open_engine(warehouse, engine=engine, spark=spark, create=True)
    pub = PublisherClient(engine=store)
    sub = SubscriberClient(engine=store)
    topic = pub.topic_path(project, "orders")
    path = sub.subscription_path(project, "orders-pull")
    say(f"warehouse: {pub.engine.warehouse} (engine: {pub.engine.name})")
    try:
        pub.create_topic(name=topic)
        say(f"created topic {topic}")
    except AlreadyExists:
        say(f"topic {topic} exists already")
    try:
        sub.create_subscription(name=path, topic=topic, ack_deadline_seconds=30)
        say(f"created pull subscription {path}")
    except AlreadyExists:
        say(f"subscription {path} exists already")

    leftover = _drain(sub, path, lambda _: None)
    if leftover:
        say(f"acked {leftover} messages left from an earlier run")

    mid = pub.publish(topic, b'{"order": 1, "item": "coffee"}', origin="quickstart").result()
    say(f"published one message: {mid}")
    ids = pub.publish_batch(
        topic, [types.PubsubMessage(data=f'{{"order": {i}}}'.encode(), attributes={"batch": "1"}) for i in range(2, 1002)]
    )
    say(f"published a batch of {len(ids)} messages in one Delta commit")
    df = spark.range(100).selectExpr("concat('{\"order\": ', id + 2000, '}') AS data", "map('source', 'spark') AS attributes")
    n = pub.publish_dataframe(topic, df)
    say(f"published a Spark DataFrame of {n} rows in one Delta commit")
    pub.stop()

    before = sub.get_backlog(path)
    say(f"backlog before pulling: {before.num_undelivered_messages} undelivered, oldest {before.oldest_unacked_message_age:.2f}s old")
    pulled = _drain(sub, path, say)
    (after,) = [b for b in sub.refresh_backlog() if b.subscription == path]
    say(
        f"backlog after acking: {after.num_unacked_messages} unacked "
        f"(written to the backlog table at {sub.engine.table_uri('backlog')})"
    )
    pushed, push_acked = _push_demo(spark, store, project, say)
    sub.close()
    return {"published": 1 + len(ids) + n, "pulled": pulled, "unacked": after.num_unacked_messages, "pushed": pushed,
            "push_acked": push_acked}


def _push_demo(spark: "SparkSession", store: Engine, project: str, say: Say) -> tuple[int, int]:
    """A push subscription to an endpoint on 127.0.0.1, delivered by the push job (on `store`,
    the run's engine) until idle. Returns (this run's messages the endpoint received, acks the
    push job merged in this run)."""
    from .config import Settings
    from .push import runner
    from .push.local_endpoint import LocalEndpoint

    pub = PublisherClient(engine=store)
    sub = SubscriberClient(engine=store, allow_http=True)  # a local http endpoint: demo only
    topic = pub.topic_path(project, "orders")
    path = sub.subscription_path(project, "orders-push")
    with LocalEndpoint() as endpoint:
        try:
            sub.create_subscription(name=path, topic=topic, push_config={"push_endpoint": endpoint.url})
        except AlreadyExists:
            # An earlier run left it behind: as a pull subscription of the same topic, or still
            # pushing to that run's (gone) endpoint if it was stopped mid-job. Either way it holds
            # what was published since (this run's pull demo too): switch it to pull and ack
            # those first, so that this run's push figures are this run's 500.
            sub.modify_push_config(subscription=path, push_config={})
            left = _drain(sub, path, lambda _: None)
            if left:
                say(f"acked {left} messages {path} got while it had no endpoint (since an earlier run)")
            sub.modify_push_config(subscription=path, push_config={"push_endpoint": endpoint.url})
        say(f"push subscription {path} -> {endpoint.url}")
        ids = pub.publish_batch(topic, [types.PubsubMessage(data=f'{{"push": {i}}}'.encode(), attributes={"via": "push"}) for i in range(500)])
        say(f"published {len(ids)} messages for the push subscription")
        try:
            settings = Settings(warehouse=store.warehouse, allow_http=True, trigger_interval=0.2, engine=store.name)
            summary = runner.run(spark, settings, until_idle=True, max_seconds=120, engine=store)
        finally:
            sub.modify_push_config(subscription=path, push_config={})  # its endpoint goes away with us: back to pull
        got = {p.message_id for p in endpoint.pushes}
        say(
            f"push job: {summary.delivered} pushed, {summary.acked} acked by the endpoint in {summary.batches} micro-batches "
            f"({summary.stopped_because}); the endpoint received {len(got & set(ids))} of {len(ids)}"
        )
    pub.stop()
    sub.close()
    return len(got & set(ids)), summary.acked
