"""Flow control: how much a streaming pull may hold, with pause/resume hysteresis."""

from __future__ import annotations

from ..types import FlowControl

RESUME_THRESHOLD = 0.8


def load(messages: int, nbytes: int, flow: FlowControl) -> float:
    return max(messages / flow.max_messages, nbytes / flow.max_bytes)


def room(messages: int, flow: FlowControl) -> int:
    """How many more messages may be pulled now."""
    return max(0, flow.max_messages - messages)


def may_dispatch(messages: int, nbytes: int, next_size: int, flow: FlowControl) -> bool:
    """Whether a held message of `next_size` bytes may go to the callback now.

    A single message larger than max_bytes is let through when nothing else is
    outstanding, so that it cannot block the stream forever.
    """
    if messages == 0:
        return True
    return messages + 1 <= flow.max_messages and nbytes + next_size <= flow.max_bytes


def next_paused(paused: bool, messages: int, nbytes: int, flow: FlowControl) -> bool:
    """Pause pulling at full load; resume only once load falls under 80%."""
    current = load(messages, nbytes, flow)
    if paused:
        return current >= RESUME_THRESHOLD
    return current >= 1.0
