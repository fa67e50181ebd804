import pytest

from deltabus import InvalidArgument, names


def test_paths_round_trip():
    assert names.topic_path("local", "orders") == "projects/local/topics/orders"
    assert names.subscription_path("local", "orders-pull") == "projects/local/subscriptions/orders-pull"
    assert names.parse_topic("projects/local/topics/orders") == ("local", "topics", "orders")


@pytest.mark.parametrize(
    "bad",
    ["ab", "1abc", "googthing", "a b c", "x" * 256, "abc/def", "abc*"],
)
def test_bad_ids_name_the_field_and_rule(bad):
    with pytest.raises(InvalidArgument) as e:
        names.topic_path("local", bad)
    assert e.value.field == "topic"
    assert "^(?!goog)" in e.value.rule


@pytest.mark.parametrize("ok", ["abc", "A-b_c.d~e+f%g", "x" * 255])
def test_good_ids(ok):
    assert names.parse_subscription(f"projects/p/subscriptions/{ok}").resource_id == ok


@pytest.mark.parametrize(
    "bad", ["orders", "projects/local/orders", "projects/local/subscriptions/orders", "projects//topics/abc", None, 5]
)
def test_malformed_names(bad):
    with pytest.raises(InvalidArgument) as e:
        names.parse_topic(bad)
    assert e.value.field == "topic"


def test_project_accepts_prefixed_form():
    assert names.parse_project("projects/local") == "local"
    with pytest.raises(InvalidArgument):
        names.parse_project("projects/")
