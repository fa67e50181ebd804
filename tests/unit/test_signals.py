"""StopRequest: what the deliver job's signal handlers set."""

from __future__ import annotations

import threading

from deltabus.spark.signals import StopRequest


def test_a_signal_arriving_inside_the_handler_does_not_deadlock():
    # Python runs signal handlers on the main thread between bytecodes, so a second signal can
    # interrupt the first handler while it holds the lock: here the clock plays that second signal.
    request: StopRequest
    calls = {"n": 0}

    def clock() -> float:
        calls["n"] += 1
        if calls["n"] == 1:
            request.signal("SIGTERM")  # re-entered on the same thread
        return 100.0 * calls["n"]

    request = StopRequest(clock=clock)
    done = threading.Event()
    t = threading.Thread(target=lambda: (request.signal("SIGINT"), done.set()), daemon=True)
    t.start()
    assert done.wait(5), "signal() deadlocked when re-entered"
    assert request.stop.is_set()


def test_first_signal_stops_second_hurries():
    now = [0.0]
    request = StopRequest(clock=lambda: now[0])
    request.signal("SIGTERM")
    assert request.stop.is_set() and not request.hurry.is_set() and request.reason == "SIGTERM received"
    now[0] = 5.0
    request.signal("SIGTERM")
    assert request.hurry.is_set()
