"""`deltabus serve` administration through the REAL google-cloud-pubsub client: topics and
subscriptions, update masks, paging, and the status codes of bad requests (nothing written).
Also `deltabus serve` as a real process: its ready line, and exit 0 on SIGTERM."""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
import sys

import pytest
from google.api_core import exceptions as gexc
from google.protobuf import field_mask_pb2
from google.cloud import pubsub_v1
from google.pubsub_v1 import types as pb

from deltabus import SubscriberClient
from tests.conftest import table_versions
from tests.server_fixtures import PROJECT, gpub, gsub, serve_thread  # noqa: F401

T = f"projects/{PROJECT}/topics/orders"
S = f"projects/{PROJECT}/subscriptions/orders-sub"


def test_topics_create_get_list_update_delete(gpub, warehouse: str) -> None:
    made = gpub.create_topic(request={"name": T, "labels": {"team": "a"}})
    assert made.name == T and dict(made.labels) == {"team": "a"}
    assert gpub.get_topic(topic=T).labels["team"] == "a"
    for i in range(3):
        gpub.create_topic(name=f"projects/{PROJECT}/topics/more-{i}")
    pager = gpub.list_topics(request={"project": f"projects/{PROJECT}", "page_size": 2})
    assert [t.name for t in pager] == sorted([T] + [f"projects/{PROJECT}/topics/more-{i}" for i in range(3)])
    assert len(list(gpub.list_topics(request={"project": f"projects/{PROJECT}", "page_size": 2}).pages)) == 2

    updated = gpub.update_topic(request={"topic": {"name": T, "labels": {"team": "b"}}, "update_mask": {"paths": ["labels"]}})
    assert dict(updated.labels) == {"team": "b"} and dict(gpub.get_topic(topic=T).labels) == {"team": "b"}
    assert list(gpub.list_topic_snapshots(topic=T)) == []

    gpub.delete_topic(topic=T)
    with pytest.raises(gexc.NotFound):
        gpub.get_topic(topic=T)


def test_topic_errors_write_nothing(gpub, warehouse: str) -> None:
    gpub.create_topic(name=T)
    before = table_versions(warehouse)
    with pytest.raises(gexc.AlreadyExists):
        gpub.create_topic(name=T)
    with pytest.raises(gexc.InvalidArgument, match="name"):
        gpub.create_topic(name=f"projects/{PROJECT}/topics/ab")  # ids are 3..255 characters
    with pytest.raises(gexc.InvalidArgument, match="name"):
        gpub.create_topic(name="topics/no-project")
    with pytest.raises(gexc.InvalidArgument, match="labels"):
        gpub.create_topic(request={"name": f"projects/{PROJECT}/topics/labelled", "labels": {"Upper": "x"}})
    with pytest.raises(gexc.InvalidArgument, match="kms_key_name"):
        gpub.create_topic(request={"name": f"projects/{PROJECT}/topics/kms", "kms_key_name": "k"})
    with pytest.raises(gexc.NotFound):
        gpub.get_topic(topic=f"projects/{PROJECT}/topics/missing")
    with pytest.raises(gexc.NotFound):
        gpub.delete_topic(topic=f"projects/{PROJECT}/topics/missing")
    with pytest.raises(gexc.NotFound):
        list(gpub.list_topic_snapshots(topic=f"projects/{PROJECT}/topics/missing"))
    with pytest.raises(gexc.InvalidArgument, match="update_mask"):
        gpub.update_topic(request={"topic": {"name": T, "kms_key_name": "k"}, "update_mask": {"paths": ["kms_key_name"]}})
    with pytest.raises(gexc.InvalidArgument, match="update_mask"):
        gpub.update_topic(request={"topic": {"name": T}, "update_mask": {"paths": []}})
    with pytest.raises(gexc.NotFound):
        gpub.update_topic(request={"topic": {"name": f"projects/{PROJECT}/topics/missing"}, "update_mask": {"paths": ["labels"]}})
    with pytest.raises(gexc.InvalidArgument, match="page_token"):
        list(gpub.list_topics(request={"project": f"projects/{PROJECT}", "page_token": "garbage"}))
    assert table_versions(warehouse) == before


def test_subscriptions_create_get_update_list_delete(gpub, gsub, warehouse: str) -> None:
    gpub.create_topic(name=T)
    dlq = gpub.create_topic(name=f"projects/{PROJECT}/topics/orders-dlq").name
    made = gsub.create_subscription(request={
        "name": S, "topic": T, "ack_deadline_seconds": 30, "labels": {"env": "test"}, "enable_message_ordering": True,
        "filter": 'attributes:kind', "retry_policy": {"minimum_backoff": dt.timedelta(seconds=2)},
        "dead_letter_policy": {"dead_letter_topic": dlq, "max_delivery_attempts": 7},
    })
    assert made.ack_deadline_seconds == 30 and made.enable_message_ordering and made.filter == "attributes:kind"
    assert made.retry_policy.minimum_backoff == dt.timedelta(seconds=2)
    assert made.retry_policy.maximum_backoff == dt.timedelta(seconds=600)  # unset: Pub/Sub's default
    assert made.dead_letter_policy.max_delivery_attempts == 7
    got = gsub.get_subscription(subscription=S)
    assert got == made

    new = gsub.update_subscription(request={
        "subscription": {"name": S, "ack_deadline_seconds": 60, "labels": {"env": "prod"}},
        "update_mask": field_mask_pb2.FieldMask(paths=["ack_deadline_seconds", "labels", "retry_policy"]),
    })
    assert new.ack_deadline_seconds == 60 and dict(new.labels) == {"env": "prod"}
    assert "retry_policy" not in new  # masked and unset: cleared
    assert new.dead_letter_policy.dead_letter_topic == dlq  # not masked: kept
    # the library's own view agrees: one registry
    with SubscriberClient(warehouse=warehouse) as own:
        rec = own.get_subscription(subscription=S)
        assert rec.ack_deadline_seconds == 60 and rec.retry_policy is None

    for i in range(2):
        gsub.create_subscription(name=f"projects/{PROJECT}/subscriptions/other-{i}", topic=T)
    names = [s.name for s in gsub.list_subscriptions(request={"project": f"projects/{PROJECT}", "page_size": 1})]
    assert names == sorted([S] + [f"projects/{PROJECT}/subscriptions/other-{i}" for i in range(2)])
    assert sorted(gpub.list_topic_subscriptions(request={"topic": T, "page_size": 2})) == names

    gsub.delete_subscription(subscription=S)
    with pytest.raises(gexc.NotFound):
        gsub.get_subscription(subscription=S)
    gpub.delete_topic(topic=T)
    assert gsub.get_subscription(subscription=names[1]).topic == "_deleted-topic_"


def test_subscription_errors_write_nothing(gpub, gsub, warehouse: str) -> None:
    gpub.create_topic(name=T)
    gsub.create_subscription(name=S, topic=T)
    before = table_versions(warehouse)
    with pytest.raises(gexc.AlreadyExists):
        gsub.create_subscription(name=S, topic=T)
    with pytest.raises(gexc.NotFound):
        gsub.create_subscription(name=f"projects/{PROJECT}/subscriptions/s-missing", topic=f"projects/{PROJECT}/topics/nope")
    with pytest.raises(gexc.InvalidArgument, match="name"):
        gsub.create_subscription(name=f"projects/{PROJECT}/subscriptions/goog-reserved", topic=T)
    with pytest.raises(gexc.InvalidArgument, match="ack_deadline_seconds"):
        gsub.create_subscription(name=f"projects/{PROJECT}/subscriptions/s-601", topic=T, ack_deadline_seconds=601)
    with pytest.raises(gexc.InvalidArgument, match="enable_exactly_once_delivery"):  # pull only (issue 15)
        gsub.create_subscription(request={"name": f"projects/{PROJECT}/subscriptions/s-eod", "topic": T,
                                          "push_config": {"push_endpoint": "https://example.com/push"},
                                          "enable_exactly_once_delivery": True})
    with pytest.raises(gexc.InvalidArgument, match="filter"):
        gsub.create_subscription(request={"name": f"projects/{PROJECT}/subscriptions/s-f", "topic": T, "filter": "bad filter ("})
    with pytest.raises(gexc.InvalidArgument, match="push_endpoint"):
        gsub.create_subscription(request={"name": f"projects/{PROJECT}/subscriptions/s-p", "topic": T,
                                          "push_config": {"push_endpoint": "ftp://x/"}})
    for paths in (["filter"], ["enable_message_ordering"], ["detached"], []):
        with pytest.raises(gexc.InvalidArgument, match="update_mask"):
            gsub.update_subscription(request={"subscription": {"name": S, "filter": "attributes:x"}, "update_mask": {"paths": paths}})
    with pytest.raises(gexc.NotFound):
        gsub.update_subscription(request={"subscription": {"name": f"projects/{PROJECT}/subscriptions/nope"},
                                          "update_mask": {"paths": ["labels"]}})
    with pytest.raises(gexc.NotFound):
        gsub.get_subscription(subscription=f"projects/{PROJECT}/subscriptions/nope")
    with pytest.raises(gexc.NotFound):
        gsub.delete_subscription(subscription=f"projects/{PROJECT}/subscriptions/nope")
    with pytest.raises(gexc.InvalidArgument, match="subscription"):
        gsub.get_subscription(subscription="projects/p/topics/not-a-subscription")
    assert table_versions(warehouse) == before


def test_a_push_subscription_made_through_the_api_is_pushed(gpub, gsub, warehouse: str) -> None:
    gpub.create_topic(name=T)
    gsub.create_subscription(request={"name": S, "topic": T, "push_config": {
        "push_endpoint": "http://127.0.0.1:9/push", "attributes": {"x-goog-version": "v1"},
        "oidc_token": {"service_account_email": "pusher@p.iam.gserviceaccount.com", "audience": "aud"}}})
    with SubscriberClient(warehouse=warehouse) as own:
        push = own.get_subscription(subscription=S).push_config
        assert push.is_push and push.push_endpoint == "http://127.0.0.1:9/push"
        assert push.oidc_token is not None and push.oidc_token.audience == "aud"
    with pytest.raises(gexc.FailedPrecondition):
        gsub.pull(subscription=S, max_messages=1, return_immediately=True)
    gsub.modify_push_config(subscription=S, push_config={})  # empty: pull
    with SubscriberClient(warehouse=warehouse) as own:
        assert not own.get_subscription(subscription=S).push_config.is_push
    assert list(gsub.pull(subscription=S, max_messages=1, return_immediately=True).received_messages) == []
    gsub.modify_push_config(subscription=S, push_config={"push_endpoint": "https://example.com/p"})
    assert gsub.get_subscription(subscription=S).push_config.push_endpoint == "https://example.com/p"


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_serve_subprocess_prints_the_ready_line_and_exits_0_when_stopped(warehouse: str, stop: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "deltabus.cli", "serve", "--warehouse", warehouse, "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ},
    )
    try:
        line = proc.stdout.readline()
        assert re.fullmatch(rf"serving google\.pubsub\.v1 on 127\.0\.0\.1:(\d+), warehouse {re.escape(warehouse)}\n", line), line
        proc.send_signal(stop)
        assert proc.wait(timeout=30) == 0
        assert proc.stdout.read() == ""  # exactly one line
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_refuses_a_network_host_without_tls(warehouse: str) -> None:
    from deltabus.cli import main

    assert main(["serve", "--warehouse", warehouse, "--port", "0", "--host", "0.0.0.0"], environ={}) == 1
    assert not os.path.exists(warehouse)


def test_serve_refuses_a_deferral_out_of_range_naming_its_flag_and_writes_nothing(warehouse: str, capsys: pytest.CaptureFixture[str]) -> None:
    from deltabus.cli import main

    assert main(["serve", "--warehouse", warehouse, "--port", "0", "--defer-seconds", "0"], environ={}) == 1
    assert "--defer-seconds" in capsys.readouterr().err
    assert not os.path.exists(warehouse)


def test_tls(warehouse: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With tls_cert/tls_key the server speaks TLS only; the real client reaches it over a
    secure channel it is given (PUBSUB_EMULATOR_HOST channels are plain text)."""
    import grpc
    from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport

    from deltabus.server.app import ServerThread
    from deltabus.server.settings import ServeSettings
    from tests.integration.test_tls import self_signed

    monkeypatch.delenv("PUBSUB_EMULATOR_HOST", raising=False)
    cert, key = self_signed(tmp_path)
    server = ServerThread(ServeSettings(warehouse=warehouse, port=0, tls_cert=str(cert), tls_key=str(key))).start()
    try:
        channel = grpc.secure_channel(f"localhost:{server.port}", grpc.ssl_channel_credentials(cert.read_bytes()))
        client = pubsub_v1.PublisherClient(transport=PublisherGrpcTransport(channel=channel))
        assert client.create_topic(name=T).name == T
        assert client.get_topic(topic=T).name == T
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as plain:
            with pytest.raises(grpc.RpcError) as e:
                plain.unary_unary("/google.pubsub.v1.Publisher/GetTopic")(pb.GetTopicRequest.serialize(pb.GetTopicRequest(topic=T)), timeout=5)
            assert e.value.code() is grpc.StatusCode.UNAVAILABLE
        channel.close()
    finally:
        server.stop()
