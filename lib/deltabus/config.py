"""Engine settings: conf/deltabus.conf, overridden by DELTABUS_<NAME> environment variables.

Parsed once at a job's entry into a frozen, validated ``Settings``; command-line flags
override both.
"""

from __future__ import annotations

import configparser
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from .errors import InvalidArgument

# The storage engines a job may choose (storage imports this; config stays free of storage imports).
ENGINES = ("auto", "delta-rs", "delta-spark")

SECTION = "deltabus"
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
    backlog_interval: float = 1.0
    engine: str = "auto"  # auto | delta-rs | delta-spark

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


def _coerce(name: str, kind: type, raw: str) -> Any:
    if kind is bool:
        v = raw.strip().lower()
        if v in TRUE:
            return True
        if v in FALSE:
            return False
        raise InvalidArgument(name, f"must be true or false, got {raw!r}")
    try:
        return kind(raw.strip())
    except ValueError:
        raise InvalidArgument(name, f"must be {kind.__name__}, got {raw!r}") from None


def load(path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Read the settings file (if any), then DELTABUS_<NAME> variables; validate once."""
    environ = os.environ if environ is None else environ
    kinds = {f.name: f.type for f in fields(Settings)}
    types = {"str": str, "bool": bool, "float": float, "int": int}
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
        raw = environ.get(f"DELTABUS_{name.upper()}")
        if raw is not None:
            values[name] = _coerce(f"DELTABUS_{name.upper()}", types[str(kind)], raw)
    return Settings(**values)


def default_path() -> Path:
    """conf/deltabus.conf of the checkout (DELTABUS_CONF chooses another file)."""
    env = os.environ.get("DELTABUS_CONF")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "conf" / "deltabus.conf"
