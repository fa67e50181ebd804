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


def test_an_endpoint_stored_before_the_rule_still_reads_and_can_be_replaced(sub, topic, monkeypatch):
    # A row as older code wrote it: the endpoint check of the time let this through.
    import deltabus.types

    old = "https://example.com:99999/push"
    name = sub.subscription_path("local", "old-push")
    with monkeypatch.context() as m:
        m.setattr(deltabus.types, "check_push_endpoint", lambda url, field="": url)
        sub.create_subscription(name=name, topic=topic, push_config={"push_endpoint": old})
    # Every read of the warehouse keeps working, and shows the endpoint as stored.
    assert sub.get_subscription(subscription=name).push_config.push_endpoint == old
    assert [s.push_config.push_endpoint for s in sub.list_subscriptions(project="projects/local") if s.name == name] == [old]
    # New writes still follow the rule, and a valid endpoint replaces the old one.
    with pytest.raises(InvalidArgument):
        sub.modify_push_config(subscription=name, push_config={"push_endpoint": old})
    sub.modify_push_config(subscription=name, push_config={"push_endpoint": "https://example.com:8443/push"})
    assert sub.get_subscription(subscription=name).push_config.push_endpoint == "https://example.com:8443/push"


def test_the_scheme_is_case_insensitive_everywhere(sub, topic, warehouse):
    from deltabus import SubscriberClient
    from deltabus.push.targets import endpoint_allowed

    before = table_versions(warehouse)
    name = sub.subscription_path("local", "upper")
    for url in ("HTTP://127.0.0.1:1/push", "Http://example.com/push"):
        with pytest.raises(InvalidArgument, match="allow_http"):  # not a way around the http refusal
            sub.create_subscription(name=name, topic=topic, push_config={"push_endpoint": url})
    assert table_versions(warehouse) == before
    sub.create_subscription(name=name, topic=topic, push_config={"push_endpoint": "HTTPS://example.com/push"})
    rec = sub._sub(name)
    assert endpoint_allowed(rec, allow_http=False)  # pushed to, not skipped as "not https"
    lenient = SubscriberClient(warehouse=warehouse, allow_http=True)
    lenient.modify_push_config(subscription=name, push_config={"push_endpoint": "HTTP://127.0.0.1:1/push"})
    rec = lenient._sub(name)
    assert endpoint_allowed(rec, allow_http=True) and not endpoint_allowed(rec, allow_http=False)
    lenient.close()
