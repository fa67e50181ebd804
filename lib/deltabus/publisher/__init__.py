from .client import PublisherClient

__all__ = ["PublisherClient"]
