"""What both clients share: opening the warehouse and the registry."""

from __future__ import annotations

import os
import time
from typing import Callable, Mapping

from .errors import InvalidArgument
from .registry import Registry
from .storage import Engine, open_engine

DEFAULT_WAREHOUSE_ENV = "DELTABUS_WAREHOUSE"


def resolve_engine(
    warehouse: str | None, engine: Engine | None, storage_options: Mapping[str, str] | None
) -> Engine:
    if engine is not None:
        return engine
    warehouse = warehouse or os.environ.get(DEFAULT_WAREHOUSE_ENV)
    if not warehouse:
        raise InvalidArgument("warehouse", f"pass warehouse= (a path or URI) or set {DEFAULT_WAREHOUSE_ENV}")
    return open_engine(warehouse, storage_options=storage_options)


class ClientBase:
    def __init__(
        self,
        warehouse: str | None = None,
        *,
        engine: Engine | None = None,
        storage_options: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = resolve_engine(warehouse, engine, storage_options)
        self._clock = clock
        self._registry = Registry(self._engine, clock=clock)

    @property
    def engine(self) -> Engine:
        return self._engine
