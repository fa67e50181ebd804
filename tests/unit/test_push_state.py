"""Per-subscription push state: outcome reasons, backoff transitions and their log lines."""

import asyncio
import datetime as dt
import socket

from deltabus.policy.push_backoff import MIN_DELAY, PushBackoff
from deltabus.push.sender import send_all
from deltabus.push.state import Round, SubState, reason_of, safe_endpoint


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once closed


def test_a_refused_connection_is_reported_as_such():
    row = dict(sub_uid="s1", subscription="projects/p/subscriptions/s", message_id="1", delivery_attempt=1,
               endpoint=f"http://127.0.0.1:{closed_port()}/push?token=secret", token=None, no_wrapper=False,
               write_metadata=False, timeout_seconds=5.0, data=b"x", attributes=[], ordering_key="",
               publish_time=dt.datetime.now(dt.timezone.utc))
    [(status, outcome, _, error)] = asyncio.run(send_all([row]))
    assert (status, outcome, error) == (0, "error", "connection refused")


def test_outcomes_are_described_by_status_or_error_class():
    assert reason_of("ack", 204, "") == "http 204"
    assert reason_of("nack", 503, "") == "http 503"
    assert reason_of("timeout", 0, "") == "timeout"
    assert reason_of("expired", 0, "") == "expired"
    assert reason_of("error", 0, "connection refused") == "connection refused"
    assert reason_of("error", 0, None) == "error"


def test_endpoints_are_logged_without_userinfo_query_or_fragment():
    assert safe_endpoint("https://user:pw@hooks.example.com/push/x?token=s3cret#frag") == "https://hooks.example.com:443/push/x"
    assert safe_endpoint("http://127.0.0.1:8080/push?key=abc") == "http://127.0.0.1:8080/push"
    assert "s3cret" not in safe_endpoint("not a url s3cret")


def test_entering_changing_cause_and_leaving_backoff_each_say_so_once():
    st = SubState()
    assert st.apply(Round(acks=10, nacks=0, last_status="http 204"), now=0.0, rand=0.5) is None  # healthy: silent
    line = st.apply(Round(acks=28, nacks=12, reasons=(("http 503", 10), ("timeout", 2)), last_status="http 503"), 0.5, 0.5)
    assert line is not None and line.startswith(f"backing off {MIN_DELAY:.1f} s")
    assert "12 of 50 nacked in the last 5 s" in line and "http 503 ×10, timeout ×2" in line
    assert st.backoff_reason == "http 503" and st.last_status == "http 503" and st.last_error == "http 503"
    # Same cause, similar delay: nothing new to say.
    assert st.apply(Round(acks=30, nacks=10, reasons=(("http 503", 10),)), 1.0, 0.5) is None
    # The cause changes: said once.
    line = st.apply(Round(acks=0, nacks=40, reasons=(("connection refused", 40),)), 1.5, 0.5)
    assert line is not None and "connection refused ×40" in line and st.backoff_reason == "connection refused"
    assert st.apply(Round(acks=0, nacks=1, reasons=(("connection refused", 1),)), 1.6, 0.5) is None
    # Clean rounds until the window holds no nacks: recovered, once.
    lines = [st.apply(Round(acks=20, nacks=0, last_status="http 200"), 2.0 + k * 0.5, 0.5) for k in range(30)]
    said = [x for x in lines if x is not None]
    assert said == ["recovered (no nacks in the last 5 s; last failure connection refused)"]
    assert st.backoff_reason is None and st.last_status == "http 200" and st.last_error == "connection refused"


def test_a_growing_delay_is_logged_again_when_it_has_moved_a_lot():
    st = SubState()
    lines, now = [], 0.0
    for _ in range(12):
        lines.append(st.apply(Round(acks=0, nacks=5, reasons=(("http 500", 5),)), now, 1.0))
        now = st.backoff.paused_until
    said = [x for x in lines if x is not None]
    assert 2 <= len(said) <= 5, said  # 0.1 s, then at most once per 4x: 0.4, 1.6, 6.4, 25.6 s...
    assert said[0].startswith("backing off 0.1 s") and said[-1].startswith("backing off")
    assert st.backoff.delay == 60.0


def test_a_subscription_with_nothing_in_flight_leaves_backoff_by_time():
    st = SubState()
    assert st.apply(Round(acks=0, nacks=2, reasons=(("http 503", 2),)), now=0.0, rand=0.5) is not None
    assert st.settle(1.0) is None  # nacks within the last 5 s: still in backoff
    st.in_flight.add("m1")
    assert st.settle(10.0) is None and st.backoff.active  # pushes in flight: their outcomes decide
    st.in_flight.clear()
    assert st.settle(10.0).startswith("recovered") and not st.backoff.active
    assert st.settle(11.0) is None  # said once
    # Still paused (a long delay): no recovery by time while the pause lasts.
    long = PushBackoff(delay=60.0, paused_until=100.0, recent=((0.0, 0, 5),))
    assert long.settled(50.0) is long and not long.settled(100.0).active
