"""Settings: conf/deltabus.conf, overridden by DELTABUS_<NAME> environment variables.

This is the one module that reads the environment. Entry points resolve settings here
once and pass them down: a job parses ``Settings`` (``load``), a client constructor reads
only the variables it uses (``client_warehouse``, ``engine_default``, ``client_allow_http``)
and only when its arguments leave them open, the command line resolves ``ClientSettings``
(``client_defaults``) for the clients it makes. Every boolean follows one truthy rule
(``parse_bool``); a job rejects any other string, a client reads it as false (as before).
Command-line flags override both.
"""

from __future__ import annotations

import configparser
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal, Mapping, get_args

from .errors import InvalidArgument

# The storage engines a job may choose (storage imports this; config stays free of storage imports).
EngineName = Literal["auto", "delta-rs", "delta-spark"]
ENGINES: tuple[EngineName, ...] = get_args(EngineName)
# What "auto" resolves to: the engine an opened ``storage.Engine`` is (its ``name``).
ConcreteEngine = Literal["delta-rs", "delta-spark"]

SECTION = "deltabus"
DELTA_SECTION = "delta-spark"
TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True, slots=True)
class Settings:
    warehouse: str = "./warehouse"
    issuer: str = "https://deltabus.local"
    allow_http: bool = False
    trigger_interval: float = 0.5
    keys_dir: str = ""  # default <warehouse>/_keys
    checkpoint_dir: str = ""  # default <warehouse>/_checkpoints
    delivery_partitions: int = 2
    max_pushes_per_batch: int = 50_000
    # Bytes of messages (data and attribute values) the push queue may hold in the driver:
    # leasing stops while it is full (a single message larger than the cap goes alone).
    max_queued_bytes: int = 256 * 1024 * 1024
    backlog_interval: float = 1.0
    engine: EngineName = "auto"
    # The delivery history (issue 17): every push attempt, lease, ack, nack, expiry and
    # dead-lettering recorded in the commit that changes delivery state.
    delivery_history: bool = True

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise InvalidArgument("engine", f"must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if not self.warehouse:
            raise InvalidArgument("warehouse", "must be a path or URI")
        if not self.issuer:
            raise InvalidArgument("issuer", "must be a non-empty string (the iss claim of push tokens)")
        if not 0.05 <= self.trigger_interval <= 3600:
            raise InvalidArgument("trigger_interval", f"must be 0.05..3600 seconds, got {self.trigger_interval}")
        if not 1 <= self.delivery_partitions <= 1024:
            raise InvalidArgument("delivery_partitions", f"must be 1..1024, got {self.delivery_partitions}")
        if not 1 <= self.max_pushes_per_batch <= 10_000_000:
            raise InvalidArgument("max_pushes_per_batch", f"must be 1..10000000, got {self.max_pushes_per_batch}")
        if not 1 <= self.max_queued_bytes <= 1 << 40:
            raise InvalidArgument("max_queued_bytes", f"must be 1..{1 << 40} bytes, got {self.max_queued_bytes}")
        if not 0 <= self.backlog_interval <= 3600:
            raise InvalidArgument("backlog_interval", f"must be 0..3600 seconds, got {self.backlog_interval}")

    def _local(self, sub: str) -> str:
        if "://" in self.warehouse and not self.warehouse.startswith("file://"):
            raise InvalidArgument(sub, f"set {sub} to a local directory when the warehouse is a URI")
        base = self.warehouse.removeprefix("file://")
        name = {"keys_dir": "_keys", "checkpoint_dir": "_checkpoints"}[sub]
        return os.path.join(os.path.abspath(base), name)

    @property
    def keys_path(self) -> str:
        return self.keys_dir or self._local("keys_dir")

    @property
    def checkpoint_path(self) -> str:
        return self.checkpoint_dir or self._local("checkpoint_dir")

    def with_overrides(self, **values: Any) -> "Settings":
        return replace(self, **{k: v for k, v in values.items() if v is not None})


def parse_bool(name: str, raw: str) -> bool:
    """The one truthy rule: 1/true/yes/on and 0/false/no/off/"" (any case, spaces ignored);
    anything else is an ``InvalidArgument`` naming `name`."""
    v = raw.strip().lower()
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    raise InvalidArgument(name, f"must be true or false, got {raw!r}")


def engine_name(name: str, raw: str) -> EngineName:
    """`raw` as an ``EngineName``; otherwise an ``InvalidArgument`` naming `name`."""
    for engine in ENGINES:
        if raw == engine:
            return engine
    raise InvalidArgument(name, f"must be one of {', '.join(ENGINES)}, got {raw!r}")


def _coerce(name: str, kind: type, raw: str) -> Any:
    if kind is bool:
        return parse_bool(name, raw)
    try:
        return kind(raw.strip())
    except ValueError:
        raise InvalidArgument(name, f"must be {kind.__name__}, got {raw!r}") from None


def load(path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Read the settings file (if any), then DELTABUS_<NAME> variables; validate once."""
    environ = os.environ if environ is None else environ
    kinds = {f.name: f.type for f in fields(Settings)}
    types = {"str": str, "bool": bool, "float": float, "int": int, "EngineName": str}
    values: dict[str, Any] = {}
    if path is not None and Path(path).exists():
        parser = configparser.ConfigParser()
        parser.read(path)
        if parser.has_section(SECTION):
            for key, raw in parser.items(SECTION):
                if key not in kinds:
                    raise InvalidArgument(f"{path}: {key}", f"unknown setting; known: {sorted(kinds)}")
                values[key] = _coerce(key, types[str(kinds[key])], raw)
    for name, kind in kinds.items():
        env_raw = environ.get(f"DELTABUS_{name.upper()}")
        if env_raw is not None:
            values[name] = _coerce(f"DELTABUS_{name.upper()}", types[str(kind)], env_raw)
    return Settings(**values)


def delta_package(path: str | os.PathLike[str]) -> str:
    """The Delta JVM package (``group:artifact:version``) pinned in the settings file's
    ``[delta-spark]`` section as ``package``: the one place the delta-spark engine's version
    is written. Not a ``Settings`` field: it is read before Spark starts (spark-submit.sh,
    the tests' session), not by a job. An ``InvalidArgument`` naming it when missing."""
    parser = configparser.ConfigParser()
    parser.read(path)
    raw = parser.get(DELTA_SECTION, "package", fallback="").strip()
    if not raw:
        raise InvalidArgument(f"{path}: [{DELTA_SECTION}] package", "must be set (group:artifact:version of the Delta JVM package)")
    return raw


def default_path(environ: Mapping[str, str] | None = None) -> Path:
    """conf/deltabus.conf of the checkout (DELTABUS_CONF chooses another file)."""
    env = (os.environ if environ is None else environ).get("DELTABUS_CONF")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "conf" / "deltabus.conf"


WAREHOUSE_ENV = "DELTABUS_WAREHOUSE"
ENGINE_ENV = "DELTABUS_ENGINE"
ALLOW_HTTP_ENV = "DELTABUS_ALLOW_HTTP"


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """What a client constructor takes from the environment, resolved once (``client_defaults``).

    ``warehouse`` is None when DELTABUS_WAREHOUSE is unset or empty (the client then needs
    ``warehouse=``). ``engine_field`` names where ``engine`` came from, for error messages.
    """

    warehouse: str | None = None
    engine: EngineName = "auto"
    allow_http: bool = False
    engine_field: str = "engine"
    # Record the delivery history (issue 17) of this client's pulls, acks and nacks.
    history: bool = True

    def __post_init__(self) -> None:
        engine_name(self.engine_field, self.engine)
        if not isinstance(self.history, bool):
            raise InvalidArgument("history", "must be a boolean")
        if self.warehouse is not None and not self.warehouse:
            raise InvalidArgument("warehouse", "must be a path or URI")


def client_warehouse(environ: Mapping[str, str] | None = None) -> str | None:
    """DELTABUS_WAREHOUSE of `environ` (default: this process's environment); None when unset or empty."""
    env = os.environ if environ is None else environ
    return env.get(WAREHOUSE_ENV) or None


def client_allow_http(environ: Mapping[str, str] | None = None) -> bool:
    """DELTABUS_ALLOW_HTTP as a client reads it: True for the true strings of the one truthy
    rule (``parse_bool``), False for anything else.

    Unlike a job's ``Settings`` (``load`` raises on "maybe"), a client treats an unrecognised
    value as false, as e32aae7's clients did: a client that constructed with such a value
    before must still construct, and false is the safe reading (https only)."""
    env = os.environ if environ is None else environ
    return env.get(ALLOW_HTTP_ENV, "").strip().lower() in TRUE


def client_defaults(environ: Mapping[str, str] | None = None) -> ClientSettings:
    """DELTABUS_WAREHOUSE (``client_warehouse``), DELTABUS_ENGINE (default auto) and
    DELTABUS_ALLOW_HTTP (``client_allow_http``) of `environ` (default: this process's
    environment), for an entry point that makes several clients (the command line). No
    settings file: clients are configured by their arguments and these variables only.

    A bad DELTABUS_ENGINE is an ``InvalidArgument`` naming it; an empty one means unset. A
    client constructed without ``settings=`` resolves only the variables it uses, and only
    when its arguments leave them open (``ClientBase``)."""
    env = os.environ if environ is None else environ
    return ClientSettings(
        warehouse=client_warehouse(env),
        engine=engine_default(env),
        allow_http=client_allow_http(env),
        engine_field=ENGINE_ENV,
    )


def engine_default(environ: Mapping[str, str] | None = None) -> EngineName:
    """DELTABUS_ENGINE of `environ` (default: this process's environment), or "auto" when unset."""
    env = os.environ if environ is None else environ
    return engine_name(ENGINE_ENV, env.get(ENGINE_ENV, "") or "auto")


def project_default(environ: Mapping[str, str] | None = None) -> str | None:
    """DELTABUS_PROJECT of `environ` (default: this process's environment), None when unset or empty."""
    env = os.environ if environ is None else environ
    return env.get("DELTABUS_PROJECT") or None


def warehouse_default(environ: Mapping[str, str] | None = None, fallback: str = "./warehouse") -> str:
    """DELTABUS_WAREHOUSE of `environ` (default: this process's environment), else `fallback`."""
    env = os.environ if environ is None else environ
    return env.get(WAREHOUSE_ENV) or fallback


def spark_workers_use_this_python() -> None:
    """Make a SparkContext started later in this process run its Python workers with this
    interpreter (the one deltabus is installed in), unless PYSPARK_PYTHON/PYSPARK_DRIVER_PYTHON
    are set already.

    Why the environment: pyspark 4.1 reads ``os.environ["PYSPARK_PYTHON"]`` when the context
    starts (``SparkContext._do_init``), and the ``spark.pyspark.python`` conf is only read by
    spark-submit's launcher, so a session started in a notebook or test has no other way."""
    import sys

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
