"""Moved to ``deltabus.delivery`` (issue 11); kept only until push/job.py and storage/maintenance.py switch."""
from .delivery.cursor import cursor_app_id  # noqa: F401
from .delivery.payloads import fetch_messages, read_payloads  # noqa: F401
from .timestamps import to_us as _us  # noqa: F401
