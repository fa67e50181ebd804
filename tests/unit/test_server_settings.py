"""ServeSettings: defaults, and each rule's error naming its field."""

from __future__ import annotations

import pytest

from deltabus.errors import InvalidArgument
from deltabus.server.settings import ServeSettings, is_loopback


def test_defaults_listen_on_loopback_without_tls() -> None:
    s = ServeSettings(warehouse="wh", port=8085)
    assert (s.host, s.tls, s.insecure, s.address) == ("127.0.0.1", False, False, "127.0.0.1:8085")


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.1", "::1", "localhost", "LOCALHOST"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)
    ServeSettings(warehouse="wh", port=1, host=host)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "example.com"])
def test_a_non_loopback_host_needs_tls_or_insecure(host: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        ServeSettings(warehouse="wh", port=1, host=host)
    assert e.value.field == "host" and "tls_cert" in e.value.rule
    assert ServeSettings(warehouse="wh", port=1, host=host, insecure=True).insecure
    assert ServeSettings(warehouse="wh", port=1, host=host, tls_cert="c.pem", tls_key="k.pem").tls


def test_ipv6_address_is_bracketed() -> None:
    assert ServeSettings(warehouse="wh", port=9, host="::1").address == "[::1]:9"


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"port": -1}, "port"),
        ({"port": 65536}, "port"),
        ({"port": True}, "port"),
        ({"port": "8085"}, "port"),
        ({"host": ""}, "host"),
        ({"host": "a b"}, "host"),
        ({"tls_cert": "c.pem"}, "tls_key"),
        ({"tls_key": "k.pem"}, "tls_cert"),
        ({"tls_cert": "", "tls_key": "k"}, "tls_cert"),
        ({"insecure": "yes"}, "insecure"),
        ({"allow_http": 1}, "allow_http"),
        ({"threads": 0}, "threads"),
        ({"grace_seconds": -1}, "grace_seconds"),
        ({"grace_seconds": float("inf")}, "grace_seconds"),
        ({"warehouse": ""}, "warehouse"),
        ({"history": "no"}, "history"),
        ({"defer_seconds": 0}, "defer_seconds"),
        ({"defer_seconds": 61}, "defer_seconds"),
        ({"defer_seconds": float("nan")}, "defer_seconds"),
        ({"defer_seconds": True}, "defer_seconds"),
    ],
)
def test_bad_values_name_their_field(kwargs: dict, field: str) -> None:
    args = {"warehouse": "wh", "port": 8085, **kwargs}
    with pytest.raises(InvalidArgument) as e:
        ServeSettings(**args)
    assert e.value.field == field


def test_frozen_and_slotted() -> None:
    s = ServeSettings(warehouse="wh", port=0)
    with pytest.raises(AttributeError):
        s.port = 1  # type: ignore[misc]
    assert not hasattr(s, "__dict__")


def test_serve_records_the_delivery_history_unless_told_not_to() -> None:
    from deltabus import cli

    assert ServeSettings("wh", 8085).history is True
    assert cli.build_parser().parse_args(["serve", "--port", "0"]).no_history is False
    assert cli.build_parser().parse_args(["serve", "--port", "0", "--no-history"]).no_history is True
