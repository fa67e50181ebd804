"""bench/latency_tail.py's pure parts: reading the job's batch lines and splitting each
message's latency into the wait for its batch and the time in it."""

from __future__ import annotations

import datetime as dt

from bench import latency_tail


def _at(ts: str) -> float:
    return dt.datetime.strptime(ts, "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=dt.timezone.utc).timestamp()


LOG = """\
2026-11-28 10:00:00,100 INFO deltabus.deliver: batch 7: delivered 50 acked 0 nacked 0 backlog 50 (1 push subscriptions, 50 fanned out) in 0.10s
2026-11-28 10:00:00,150 INFO some.other.logger: batch 9: delivered 1 in 0.01s
2026-11-28 10:00:00,300 INFO deltabus.deliver: batch 8: delivered 0 acked 50 nacked 0 backlog 0 (1 push subscriptions, 0 fanned out) in 0.05s
"""


def test_batches_are_read_from_the_job_s_own_lines_as_start_and_seconds():
    runs = latency_tail.batches(LOG)
    assert [round(s, 3) for s, _ in runs] == [round(_at("2026-11-28 10:00:00,000"), 3), round(_at("2026-11-28 10:00:00,250"), 3)]
    assert [d for _, d in runs] == [0.10, 0.05]


def test_each_message_goes_to_the_batch_running_when_it_arrived():
    t0 = 1000.0
    runs = [(t0, 0.1), (t0 + 0.2, 0.1), (t0 + 0.4, 0.1)]
    published = {"a": t0 - 0.05, "b": t0 + 0.05, "c": t0 + 0.1, "lost": t0}
    seen = {"a": t0 + 0.02, "b": t0 + 0.25, "c": t0 + 0.45, "early": t0 - 1}
    out = latency_tail.split(published, seen, runs)
    assert out["messages"] == 4 and out["matched"] == 3  # "lost" never arrived
    # a: waited 0.05 s for the batch at t0, 0.02 s in it; c: waited 0.3 s, 0.05 s in it.
    assert out["max_s"] == 0.35 and out["p50_s"] == 0.2
    past = out["at_or_past_p99"]
    assert past["messages"] == 1 and past["wait_p50_s"] == 0.3 and past["in_batch_p50_s"] == 0.05
    assert out["batch_start_gaps_s"]["p50"] == 0.2 and out["batch_seconds"]["max"] == 0.1


def test_nothing_received_is_no_error():
    out = latency_tail.split({"a": 1.0}, {}, [(0.0, 0.1)])
    assert out["matched"] == 0 and out["p50_s"] is None and out["at_or_past_p99"]["messages"] == 0
