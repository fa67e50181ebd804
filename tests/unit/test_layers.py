"""Layers only point down (ARCHITECTURE.md): every import in lib/deltabus, including the ones
inside functions, goes to a module of the same layer or a lower one.

test_imports.py catches import-time cycles; this catches the upward dependencies that make
them possible, before they bite (a function-level import of a client from ``spark`` or of
``leasing`` from ``storage`` was how round 1's layers looped).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

LIB = pathlib.Path(__file__).resolve().parents[2] / "lib"
PACKAGE = LIB / "deltabus"

# Lowest first. A module belongs to the first entry that names it or a package above it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        (
            "errors", "config", "names", "ids", "ackid", "timestamps", "validation", "types",
            "subscription_fields", "_call_args", "_closing", "pagination", "pagers", "jsonl",
            "watch", "policy", "_server_thread",
        ),
    ),
    ("storage", ("storage",)),
    ("domain", ("registry", "snapshots", "delivery", "backlog", "activity")),
    ("spark", ("spark",)),
    ("paths", ("publisher", "subscriber", "push", "retention", "_common")),
    ("server", ("server",)),  # `deltabus serve` (issue 14): the gRPC services over the clients
    ("entry", ("cli", "quickstart", "")),  # "" = the package's __init__
]


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(LIB).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int:
    rel = module.removeprefix("deltabus").removeprefix(".")
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            if name and (rel == name or rel.startswith(name + ".")):
                return index
    if rel == "":
        return len(LAYERS) - 1
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")


def imports(path: pathlib.Path, source: str | None = None) -> set[str]:
    """deltabus modules `path` imports (resolving relative imports; `from x import y` counts as
    x.y when y is a module). `source`: the text to scan instead of the file's."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source, str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "deltabus")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "deltabus":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                as_path = LIB / sub.replace(".", "/")
                found.add(sub if as_path.with_suffix(".py").exists() or as_path.is_dir() else target)
    found.discard(module)
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer() -> None:
    for path in MODULES:
        layer_of(module_name(path))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_imports_point_down(path: pathlib.Path) -> None:
    mine = layer_of(module_name(path))
    upward = sorted(
        f"{target} ({LAYERS[layer_of(target)][0]})" for target in imports(path) if layer_of(target) > mine
    )
    assert not upward, f"{module_name(path)} ({LAYERS[mine][0]}) imports upward: {upward}"


def test_the_check_sees_function_level_and_relative_imports() -> None:
    # The scan must catch what it is for: an upward import hidden in a function, written relative.
    engine = PACKAGE / "storage" / "engine.py"
    source = "def f():\n    from ..subscriber.client import SubscriberClient\n    return SubscriberClient\n"
    found = imports(engine, source)
    assert found == {"deltabus.subscriber.client"}
    assert layer_of("deltabus.subscriber.client") > layer_of("deltabus.storage.engine")
