"""What the push job's driver and its push workers exchange: Arrow IPC streams over HTTP.

The driver hands out *assignments* (rows of ``WORK_SCHEMA``); a worker answers with one
``RESULT_SCHEMA`` row per push it made. Both carry the assignment number, so the driver
knows which assignment each outcome settles.
"""

from __future__ import annotations

import pyarrow as pa

from .sender import OUTCOME_SCHEMA, REQUEST_SCHEMA

WORK_SCHEMA = REQUEST_SCHEMA.append(pa.field("assignment", pa.int64()))
RESULT_SCHEMA = OUTCOME_SCHEMA.append(pa.field("assignment", pa.int64()))

AUTH_HEADER = "X-Deltabus-Pool-Key"
WORKER_HEADER = "X-Deltabus-Worker"
PENDING_HEADER = "X-Deltabus-Pending"  # JSON {sub_uid: rows the worker holds}; how much more it can take


def to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def from_ipc(data: bytes, schema: pa.Schema) -> pa.Table:
    table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    if not table.schema.equals(schema):
        table = table.cast(schema)
    return table
