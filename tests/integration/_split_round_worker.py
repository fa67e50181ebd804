"""One group-commit round that commits new messages' leases before its ack, SIGKILLed in
between (test_group_commit.py's crash test): the leases were appended and handed over
(``run_round``'s `early`), the ack's MERGE never ran.

Usage: python _split_round_worker.py WAREHOUSE SUBSCRIPTION ACK_ID
Prints the handed-over message ids as one JSON line, then kills itself.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from deltabus import ackid
from deltabus.registry import Registry
from deltabus.server.group_commit import Granted, LeaseAsk, OutcomeAsk, run_round
from deltabus.storage import open_engine


def main(warehouse: str, subscription: str, ack_id: str) -> None:
    engine = open_engine(warehouse, engine="delta-rs")
    rec = Registry(engine, clock=time.time).subscription(subscription)

    def die(answers: dict) -> None:
        got = [m.message.message_id for a in answers.values() if isinstance(a, Granted) for m in a.messages]
        print(json.dumps(got), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    run_round(engine, rec, [OutcomeAsk((ackid.decode(ack_id),), None), LeaseAsk(10, 30.0)], time.time, early=die)
    raise SystemExit("not killed: the round did not split")


if __name__ == "__main__":
    main(*sys.argv[1:])
