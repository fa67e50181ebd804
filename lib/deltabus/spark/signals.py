"""Stop a Spark driver program cleanly on SIGTERM and SIGINT (Ctrl-C), under spark-submit too.

Under ``spark-submit`` the process a scheduler signals is the driver JVM (``SparkSubmit``);
the Python driver is its child. ``./spark-submit.sh`` runs it in a session of its own and
passes SIGTERM and SIGINT, sent to its pid or its group, to the JVM alone
(scripts/own_session.py). The JVM's default TERM/INT handlers run its shutdown hooks, which
stop the SparkContext under the Python program's feet: the job died with exit 143 and a
``RpcEnvStoppedException`` trace, and nothing in flight was merged. So the Python driver
replaces the JVM's TERM and INT handlers (``sun.misc.Signal.handle``) with a Python object
implementing ``sun.misc.SignalHandler`` through py4j's callback server (the one pyspark
starts for ``foreachBatch``): the JVM then only tells Python, and Python stops the job in
order. This keeps plain ``spark-submit`` working too. Python's own handlers cover a signal
sent to the Python process alone (and, under plain ``spark-submit``, a terminal's Ctrl-C,
which reaches both; ``policy.stopping`` counts that as one signal).

Under plain ``spark-submit``, Ctrl-C reaches the whole foreground process group. pyspark's
daemon puts its workers (the push workers among them) in a group of their own. The stream
source's Python runner is in the JVM's group: it may inherit SIGINT ignored (a shell's
background job does), but not from a terminal, and under load a Ctrl-C was seen to raise
KeyboardInterrupt in it and fail the query. So ``spark.source`` ignores SIGINT in that
process itself.

A signal that arrives before the JVM handlers are installed (the first seconds of startup)
still ends the JVM the default way: nothing has been leased by then.
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable

from ..policy.stopping import StopSignals

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

log = logging.getLogger("deltabus.signals")

HANDLED = ("TERM", "INT")


class StopRequest:
    """Thread-safe: `stop` is set by the first signal, `hurry` by a second one."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.stop = threading.Event()
        self.hurry = threading.Event()
        self._clock = clock
        # Reentrant: Python runs its signal handlers on the main thread between bytecodes, so
        # a second signal can arrive while the first handler holds the lock.
        self._lock = threading.RLock()
        self._state = StopSignals()

    @property
    def reason(self) -> str:
        name = self._state.first_name
        return f"{name} received" if name else "stop requested"

    def signal(self, name: str) -> None:
        with self._lock:
            before = self._state
            self._state = after = before.after(name, self._clock())
        if after is before:
            return
        if after.stage == "stopping":
            log.info("%s: stopping (send it again to stop without waiting for the pushes in flight)", name)
            self.stop.set()
        elif not self.hurry.is_set():
            log.info("%s again: stopping without waiting; what was reported is merged", name)
            self.hurry.set()
            self.stop.set()


class _JvmHandler:
    """A ``sun.misc.SignalHandler`` the JVM calls (on its signal thread) through py4j."""

    def __init__(self, on_signal: Callable[[str], None]) -> None:
        self._on_signal = on_signal

    def handle(self, sig: Any) -> None:
        try:
            self._on_signal("SIG" + sig.getName())
        except Exception:  # never let an error travel back into the JVM's signal thread
            log.exception("handling a signal failed")

    class Java:
        implements = ["sun.misc.SignalHandler"]


def _restore_jvm_handler(jvm: Any, jsig: Any, previous: Any) -> None:
    """Put `previous` back as the JVM's handler of `jsig` (looked up when called: the JVM may be gone)."""
    jvm.sun.misc.Signal.handle(jsig, previous)


def install(spark: "SparkSession", request: StopRequest) -> Callable[[], None]:
    """Route SIGTERM and SIGINT, in the Python driver and in its JVM, to `request`.

    Returns a function that puts the previous handlers back. Call from the main thread."""

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        request.signal(signal.Signals(signum).name)

    # Each step's result (the handler it replaced) is not used.
    undo: list[Callable[[], object]] = []
    for name in HANDLED:
        signum = signal.Signals["SIG" + name]
        previous = signal.signal(signum, on_signal)
        undo.append(functools.partial(signal.signal, signum, previous))

    from pyspark.java_gateway import ensure_callback_server_started

    gateway = spark.sparkContext._gateway
    jvm = spark.sparkContext._jvm
    ensure_callback_server_started(gateway)
    if jvm is None:  # pyspark types it Optional: set only while a SparkContext is running
        raise RuntimeError("the SparkSession has no JVM: its SparkContext is stopped")
    handler = _JvmHandler(request.signal)
    for name in HANDLED:
        try:
            jsig = jvm.sun.misc.Signal(name)
            previous = jvm.sun.misc.Signal.handle(jsig, handler)
        except Exception as exc:  # e.g. INT ignored by the JVM (pyspark started it with SIGINT ignored)
            log.debug("the JVM's SIG%s handler stays as it was: %s", name, str(exc).splitlines()[0] if str(exc) else exc)
            continue
        undo.append(functools.partial(_restore_jvm_handler, jvm, jsig, previous))

    def uninstall() -> None:
        for step in reversed(undo):
            try:
                step()
            except Exception:  # the JVM is gone already: nothing left to restore there
                pass
        undo.clear()
        handler._on_signal = lambda _name: None  # a py4j proxy may outlive us in the JVM

    return uninstall
