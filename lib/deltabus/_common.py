"""What both clients share: opening the warehouse and the registry."""

from __future__ import annotations

import threading
from typing import Callable, Mapping

from . import config
from .errors import InvalidArgument
from .policy.clock_skew import ClockSkewPolicy
from .registry import Registry
from .storage import Engine, check_warehouse_path, open_engine
from .storage.clock import StorageClock, resolve_clock, wall

DEFAULT_WAREHOUSE_ENV = config.WAREHOUSE_ENV


def resolve_warehouse(warehouse: str | None, defaults: config.ClientSettings | None = None) -> str:
    """`warehouse`, else DELTABUS_WAREHOUSE (of `defaults` when given, else read now, only
    because it is needed); checked (a file is an error)."""
    if not warehouse:
        warehouse = defaults.warehouse if defaults is not None else config.client_warehouse()
    if not warehouse:
        raise InvalidArgument("warehouse", f"pass warehouse= (a path or URI) or set {DEFAULT_WAREHOUSE_ENV}")
    return check_warehouse_path(warehouse)


class ClientBase:
    """Opens the warehouse on first use.

    With ``create_warehouse`` the warehouse is created (when missing) at once. Without it
    the client never creates one: its first call raises ``WarehouseNotFound`` ("no
    warehouse at PATH") while there is none, and opens it once it exists, so a client made
    before another process creates the warehouse still works.

    The constructor is an entry point. With ``settings=`` (the command line's resolved
    ``ClientSettings``) it reads no environment. Without it, it resolves only what its
    arguments leave open, once: DELTABUS_WAREHOUSE when no ``warehouse`` is given, and
    DELTABUS_ENGINE when the warehouse is opened (never with ``engine=``). So a bad value
    of a variable a client does not use cannot break it, and a bad DELTABUS_ENGINE fails
    where e32aae7 failed: on the first open. With the engine "auto" (or "delta-spark") it
    passes this thread's active SparkSession, if any, to ``open_engine``.

    The clock (issue 16). Without ``clock=`` the client keeps the storage's time: a
    ``StorageClock`` over this host's clock, under ``clock_skew`` (default
    ``ClockSkewPolicy()``), fed by the engine's commits and probes of the warehouse's
    folder, so its leases hold against processes whose clocks are off. A given ``clock``
    is used as it is (a test's clock, a server's StorageClock shared by its clients),
    unless ``clock_skew`` is given too: then it is the local clock the correction starts
    from. ``clock_skew=ClockSkewPolicy(correct=False)`` turns the correction off.
    """

    def __init__(
        self,
        warehouse: str | None = None,
        *,
        engine: Engine | None = None,
        storage_options: Mapping[str, str] | None = None,
        clock: Callable[[], float] | None = None,
        clock_skew: ClockSkewPolicy | None = None,
        create_warehouse: bool = False,
        settings: config.ClientSettings | None = None,
    ) -> None:
        self._settings = settings
        self._clock = resolve_clock(clock, clock_skew)
        self._open_lock = threading.Lock()
        self._opened: tuple[Engine, Registry] | None = None
        if engine is not None:
            self._attach(engine)
            self._opened = (engine, Registry(engine, clock=wall(self._clock)))
            return
        self._warehouse = resolve_warehouse(warehouse, settings)  # a bad path (a file) fails here, at once
        self._storage_options = storage_options
        if create_warehouse:
            self._open(create=True)

    def _engine_choice(self) -> tuple[config.EngineName, str]:
        """The engine name to open with and the field errors name: the given settings', else
        DELTABUS_ENGINE read now (``InvalidArgument`` naming it when bad)."""
        if self._settings is not None:
            return self._settings.engine, self._settings.engine_field
        return config.engine_default(), config.ENGINE_ENV

    def _open(self, create: bool = False) -> tuple[Engine, Registry]:
        with self._open_lock:
            if self._opened is None:
                chosen, field = self._engine_choice()
                spark = None
                if chosen != "delta-rs":
                    from .spark import active_session

                    spark = active_session()
                engine = open_engine(
                    self._warehouse, engine=chosen, storage_options=self._storage_options, spark=spark, create=create,
                    engine_field=field,
                )
                self._attach(engine)
                self._opened = (engine, Registry(engine, clock=wall(self._clock)))
            return self._opened

    def _attach(self, engine: Engine) -> None:
        if isinstance(self._clock, StorageClock):
            self._clock.attach(engine)

    @property
    def _engine(self) -> Engine:
        return (self._opened or self._open())[0]

    @property
    def _registry(self) -> Registry:
        return (self._opened or self._open())[1]

    @property
    def engine(self) -> Engine:
        return self._engine
