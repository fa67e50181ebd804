"""What both clients share: opening the warehouse and the registry."""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Mapping

from .errors import InvalidArgument
from .registry import Registry
from .storage import Engine, check_warehouse_path, open_engine

DEFAULT_WAREHOUSE_ENV = "DELTABUS_WAREHOUSE"


def resolve_warehouse(warehouse: str | None) -> str:
    warehouse = warehouse or os.environ.get(DEFAULT_WAREHOUSE_ENV)
    if not warehouse:
        raise InvalidArgument("warehouse", f"pass warehouse= (a path or URI) or set {DEFAULT_WAREHOUSE_ENV}")
    return check_warehouse_path(warehouse)


class ClientBase:
    """Opens the warehouse on first use.

    With ``create_warehouse`` the warehouse is created (when missing) at once. Without it
    the client never creates one: its first call raises ``WarehouseNotFound`` ("no
    warehouse at PATH") while there is none, and opens it once it exists, so a client made
    before another process creates the warehouse still works.
    """

    def __init__(
        self,
        warehouse: str | None = None,
        *,
        engine: Engine | None = None,
        storage_options: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        create_warehouse: bool = False,
    ) -> None:
        self._clock = clock
        self._open_lock = threading.Lock()
        self._opened: tuple[Engine, Registry] | None = None
        if engine is not None:
            self._opened = (engine, Registry(engine, clock=clock))
            return
        self._warehouse = resolve_warehouse(warehouse)  # a bad path (a file) fails here, at once
        self._storage_options = storage_options
        if create_warehouse:
            self._open(create=True)

    def _open(self, create: bool = False) -> tuple[Engine, Registry]:
        with self._open_lock:
            if self._opened is None:
                engine = open_engine(self._warehouse, storage_options=self._storage_options, create=create)
                self._opened = (engine, Registry(engine, clock=self._clock))
            return self._opened

    @property
    def _engine(self) -> Engine:
        return (self._opened or self._open())[0]

    @property
    def _registry(self) -> Registry:
        return (self._opened or self._open())[1]

    @property
    def engine(self) -> Engine:
        return self._engine
