"""Push endpoints are validated on every way in through the Python API, and a bad one writes nothing."""

from __future__ import annotations

import pytest

from deltabus import InvalidArgument, types
from tests.conftest import table_versions

BAD = ["https://exa mple.com/push", "https://example.com:99999/push", "https://u:p@example.com/push", "https://example.com/p#f"]


@pytest.mark.parametrize("url", BAD)
def test_every_api_path_refuses_a_bad_endpoint(sub, topic, subscription, warehouse, url):
    before = table_versions(warehouse)
    calls = [
        lambda: sub.create_subscription(name=sub.subscription_path("local", "bad-push"), topic=topic, push_config={"push_endpoint": url}),
        lambda: sub.update_subscription(subscription={"name": subscription, "push_config": {"push_endpoint": url}}, update_mask=["push_config"]),
        lambda: sub.modify_push_config(subscription=subscription, push_config={"push_endpoint": url}),
        lambda: sub.modify_push_config(request={"subscription": subscription, "push_config": {"push_endpoint": url}}),
    ]
    for call in calls:
        with pytest.raises(InvalidArgument) as e:
            call()
        assert e.value.field == "push_config.push_endpoint"
    assert table_versions(warehouse) == before
    assert not sub.get_subscription(subscription=subscription).push_config.is_push


def test_a_good_endpoint_is_stored_as_given(sub, topic, subscription):
    url = "https://push.example.com:8443/hook?token=abc"
    sub.modify_push_config(subscription=subscription, push_config=types.PushConfig(push_endpoint=url))
    assert sub.get_subscription(subscription=subscription).push_config.push_endpoint == url
