"""Time as the tables store it: microseconds since the epoch, UTC.

One rounding rule for the whole code base: ``to_us`` rounds to the nearest microsecond
(Python's ``round``, half to even). Every lease deadline, publish time and "now" compared
with them goes through it, so two paths never disagree by a truncated microsecond.
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

US_PER_SECOND = 1_000_000
TS = pa.timestamp("us", tz="UTC")


def to_us(seconds: float) -> int:
    """Seconds since the epoch as whole microseconds (rounded to the nearest)."""
    return round(seconds * US_PER_SECOND)


def ts_scalar(seconds: float) -> pa.TimestampScalar:
    """An Arrow timestamp (us, UTC) for seconds since the epoch."""
    return pa.scalar(to_us(seconds), TS)


def utc(seconds: float) -> dt.datetime:
    """A timezone-aware UTC datetime for seconds since the epoch (microsecond precision)."""
    return dt.datetime.fromtimestamp(to_us(seconds) / US_PER_SECOND, tz=dt.timezone.utc)


def timestamp_sql(seconds: float) -> str:
    """A time (UTC, microseconds) to compare a TS column with in a predicate: a quoted string,
    which the engine coerces to the column's type. Measured with deltalake 1.6.6: a delete
    predicate against ``CAST('...' AS TIMESTAMP)`` fails ("Timestamp(µs, "UTC") <
    Timestamp(ns)"), the string compares as a timestamp; Spark SQL coerces it too."""
    return f"'{utc(seconds).strftime('%Y-%m-%dT%H:%M:%S.%fZ')}'"
