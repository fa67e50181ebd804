"""deltabus: Pub/Sub's topics, subscriptions, push and pull delivery, on Delta tables and Spark."""

from . import types
from .errors import AlreadyExists, Aborted, Cancelled, ClientClosed, DeltabusError, FailedPrecondition, InvalidArgument, NotFound, OrderingNotEnabled, WarehouseNotFound
from .publisher import PublisherClient
from .subscriber import SubscriberClient

__version__ = "0.1.0"

__all__ = [
    "PublisherClient",
    "SubscriberClient",
    "types",
    "DeltabusError",
    "InvalidArgument",
    "NotFound",
    "AlreadyExists",
    "FailedPrecondition",
    "Aborted",
    "Cancelled",
    "ClientClosed",
    "OrderingNotEnabled",
    "WarehouseNotFound",
]
