"""Opening a warehouse: reads never create one, and a bad path is a clear error."""

from __future__ import annotations

import os

import pytest

from deltabus import InvalidArgument, NotFound, PublisherClient, SubscriberClient
from deltabus.errors import WarehouseNotFound
from deltabus.storage import open_engine
from tests.conftest import table_versions


def test_subscriber_on_a_missing_warehouse_says_so_and_creates_nothing(tmp_path):
    typo = str(tmp_path / "wharehouse")
    sub = SubscriberClient(warehouse=typo)
    for call in (
        lambda: sub.list_subscriptions(project="local"),
        lambda: sub.get_subscription(subscription="projects/local/subscriptions/orders-pull"),
        lambda: sub.pull(subscription="projects/local/subscriptions/orders-pull", max_messages=1, return_immediately=True),
        lambda: sub.refresh_backlog(),
        lambda: sub.create_subscription(name="projects/local/subscriptions/abc", topic="projects/local/topics/abc"),
    ):
        with pytest.raises(WarehouseNotFound) as e:
            call()
        assert isinstance(e.value, NotFound) and str(e.value) == f"no warehouse at {typo}"
    assert not os.path.exists(typo)


def test_a_client_made_before_the_warehouse_opens_it_once_it_exists(tmp_path):
    wh = str(tmp_path / "wh")
    sub = SubscriberClient(warehouse=wh)
    with pytest.raises(WarehouseNotFound):
        sub.list_subscriptions(project="local")
    PublisherClient(warehouse=wh).create_topic(name="projects/local/topics/orders")
    assert list(sub.list_subscriptions(project="local")) == []


def test_publisher_without_create_warehouse_creates_only_on_create_topic(tmp_path):
    wh = str(tmp_path / "wh")
    pub = PublisherClient(warehouse=wh, create_warehouse=False)
    with pytest.raises(WarehouseNotFound):
        pub.list_topics(project="local")
    with pytest.raises(WarehouseNotFound):
        pub.publish_batch("projects/local/topics/orders", [{"data": b"x"}])
    with pytest.raises(InvalidArgument):
        pub.create_topic(name="projects/local/topics/x")  # a bad request creates nothing either
    assert not os.path.exists(wh)
    pub.create_topic(name="projects/local/topics/orders")
    assert [t.name for t in pub.list_topics(project="local")] == ["projects/local/topics/orders"]
    assert set(table_versions(wh)) >= {"topics", "subscriptions", "messages", "deliveries"}


def test_publisher_by_default_creates_the_warehouse(tmp_path):
    wh = str(tmp_path / "wh")
    PublisherClient(warehouse=wh)
    assert table_versions(wh)["topics"] == 0


@pytest.mark.parametrize("under", [False, True])
def test_a_warehouse_path_that_is_a_file_is_one_clear_error(tmp_path, under):
    f = tmp_path / "afile"
    f.write_text("not a warehouse")
    path = str(f / "wh") if under else str(f)
    for make in (lambda: SubscriberClient(warehouse=path), lambda: PublisherClient(warehouse=path), lambda: open_engine(path)):
        with pytest.raises(InvalidArgument) as e:
            make()
        assert e.value.field == "warehouse" and "is a file" in e.value.rule and str(f) in e.value.rule
    assert f.read_text() == "not a warehouse"


def test_open_engine_without_create(tmp_path):
    wh = str(tmp_path / "wh")
    with pytest.raises(WarehouseNotFound):
        open_engine(wh, create=False)
    assert not os.path.exists(wh)
    open_engine(wh)  # jobs and set-up create it
    assert open_engine(wh, create=False).version("topics") == 0
