from .client import SubscriberClient
from .futures import StreamingPullFuture
from .message import Message

__all__ = ["SubscriberClient", "StreamingPullFuture", "Message"]
