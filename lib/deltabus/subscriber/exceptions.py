"""google-cloud-pubsub's ``subscriber.exceptions``: where its users import these from."""

from __future__ import annotations

from ..errors import AcknowledgeError, AcknowledgeStatus

__all__ = ["AcknowledgeError", "AcknowledgeStatus"]
