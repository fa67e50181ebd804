import pytest

from deltabus import InvalidArgument
from deltabus.types import (
    BatchSettings,
    FlowControl,
    NoWrapper,
    OidcToken,
    PushConfig,
    Subscription,
    validate_ack_deadline,
    validate_labels,
)


def test_push_config_from_pubsub_json_shape():
    pc = PushConfig.coerce(
        {
            "push_endpoint": "https://example.com/push",
            "oidc_token": {"service_account_email": "sa@p.iam.gserviceaccount.com", "audience": "aud"},
            "no_wrapper": {"write_metadata": True},
        }
    )
    assert pc.is_push
    assert pc.oidc_token == OidcToken("sa@p.iam.gserviceaccount.com", "aud")
    assert pc.no_wrapper == NoWrapper(True)
    assert not PushConfig.coerce(None).is_push


@pytest.mark.parametrize(
    "value, field",
    [
        ({"push_endpoint": "ftp://x/y"}, "push_config.push_endpoint"),
        ({"push_endpoint": "not a url"}, "push_config.push_endpoint"),
        ({"push_endpoint": "https://x", "oidc_token": {"service_account_email": "nope"}}, "push_config.oidc_token.service_account_email"),
        ({"push_endpoint": "", "no_wrapper": {"write_metadata": False}}, "push_config"),
        ({"push_endpoint": "https://x", "no_wrapper": {"write_metadata": "yes"}}, "push_config.no_wrapper.write_metadata"),
        ({"endpoint": "https://x"}, "push_config"),
        ({"push_endpoint": "https://x", "oidc_token": {"service_account_email": "a@b", "aud": "x"}}, "push_config.oidc_token"),
        ({"push_endpoint": "https://x", "oidc_token": "a@b"}, "push_config.oidc_token"),
        ({"push_endpoint": "https://x", "no_wrapper": True}, "push_config.no_wrapper"),
        ({"push_endpoint": "https://x", "no_wrapper": {"write_metadata": True, "x": 1}}, "push_config.no_wrapper"),
    ],
)
def test_push_config_rules(value, field):
    with pytest.raises(InvalidArgument) as e:
        PushConfig.coerce(value)
    assert e.value.field == field


def test_ack_deadline_range():
    assert validate_ack_deadline(None) == 10
    assert validate_ack_deadline(0) == 10
    assert validate_ack_deadline(600) == 600
    for bad in (9, 601, -1, 10.5, True, False, "10"):
        with pytest.raises(InvalidArgument) as e:
            validate_ack_deadline(bad)
        assert e.value.field == "ack_deadline_seconds"


def test_labels():
    assert validate_labels({"env": "prod"}) == {"env": "prod"}
    with pytest.raises(InvalidArgument):
        validate_labels({"Env": "x"})


def test_flow_control_defaults_match_pubsub():
    fc = FlowControl()
    assert (fc.max_messages, fc.max_bytes, fc.max_lease_duration) == (1000, 100 * 1024 * 1024, 3600)
    with pytest.raises(InvalidArgument) as e:
        FlowControl(max_messages=0)
    assert e.value.field == "flow_control.max_messages"
    with pytest.raises(InvalidArgument):
        FlowControl(min_duration_per_lease_extension=5)
    with pytest.raises(InvalidArgument):
        FlowControl(min_duration_per_lease_extension=60, max_duration_per_lease_extension=30)


def test_batch_settings():
    with pytest.raises(InvalidArgument) as e:
        BatchSettings(max_messages=0)
    assert e.value.field == "batch_settings.max_messages"


def test_subscription_coerce_rejects_unknown():
    with pytest.raises(InvalidArgument):
        Subscription.coerce({"name": "n", "topic": "t", "bogus": 1})
