"""Every module of lib/deltabus imports on its own, as the first import of a fresh interpreter.

An import cycle often works from one entry point and breaks from another (``a`` imports
``b`` which takes a name from the half-run ``a``), so importing the package once proves
little: ``deltabus/__init__`` pulls in most modules in one order. Here each module is
imported after every ``deltabus`` module was dropped from ``sys.modules``, so it is the
first deltabus import, as in a job, a Spark worker or a user's script that imports only it.

Speed: a process per module pays the interpreter and third-party imports (pyarrow,
deltalake, pyspark, aiohttp) each time; instead one process per core imports its share
of the modules, dropping only deltabus's between them. Third-party modules stay loaded:
they do not import deltabus, so a cycle through them cannot hide. Measured here: one
fresh deltabus import costs 0.14 s of CPU when its sources are compiled again each time
(PYTHONDONTWRITEBYTECODE=1, as in our shells) and 0.06 s when they are not, so a child
compiles each module once and runs the same code object in every fresh import (that is
what a cached .pyc gives an interpreter too), writing nothing to disk.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests import background

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "lib"

# Run in a child interpreter: argv[1] is the package, argv[2:] the modules to import.
# Prints one JSON object: {module: "ExcType: message"} for the modules that failed.
_CHILD = r"""
import importlib, importlib.machinery, json, sys, traceback
package, modules = sys.argv[1], sys.argv[2:]
compiled = {}
load_code = importlib.machinery.SourceFileLoader.get_code
def get_code(loader, fullname):
    if fullname not in compiled:
        compiled[fullname] = load_code(loader, fullname)
    return compiled[fullname]
importlib.machinery.SourceFileLoader.get_code = get_code
failed = {}
for name in modules:
    for loaded in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failed[name] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
print(json.dumps(failed))
"""


def modules_of(lib: Path, package: str) -> list[str]:
    """Dotted names of the package and every module under it, from the files (nothing imported)."""
    names = []
    for path in sorted((lib / package).rglob("*.py")):
        parts = list(path.relative_to(lib).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return names


def import_each(lib: Path, package: str, workers: int | None = None) -> dict[str, str]:
    """Import every module of ``package`` under ``lib`` alone; the failures, by module."""
    modules = modules_of(lib, package)
    workers = max(1, min(workers or os.cpu_count() or 1, len(modules)))
    base = background.env()
    env = {**base, "PYTHONPATH": os.pathsep.join([str(lib), base.get("PYTHONPATH", "")])}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, package, *modules[i::workers]],
            cwd=lib, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(workers)
    ]
    failed: dict[str, str] = {}
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, f"the import checker itself failed:\n{err}"
        failed.update(json.loads(out.strip().splitlines()[-1]))
    return failed


def every_deltabus_module_imports_alone_in_a_fresh_interpreter(_tmp: Path) -> None:
    modules = modules_of(LIB, "deltabus")
    assert "deltabus.storage.engine" in modules and "deltabus" in modules  # the walk found the tree
    failed = import_each(LIB, "deltabus")
    assert not failed, "modules that fail as the first deltabus import (an import cycle?):\n" + "\n".join(
        f"  {name}: {error}" for name, error in sorted(failed.items())
    )


# One interpreter per module (~8 s): in the background from the session's first test on (tests/background.py).
BACKGROUND = {"test_every_deltabus_module_imports_alone_in_a_fresh_interpreter": every_deltabus_module_imports_alone_in_a_fresh_interpreter}


def test_every_deltabus_module_imports_alone_in_a_fresh_interpreter(early_background):
    early_background.result("test_every_deltabus_module_imports_alone_in_a_fresh_interpreter")


def test_a_cycle_that_works_from_one_side_only_is_reported(tmp_path):
    # `cyc.a` imported first works (b finds a half-run in sys.modules and needs nothing of
    # it); `cyc.b` imported first fails (a wants X from the half-run b). Importing in name
    # order in one process would load b along with a, and then miss the failure.
    pkg = tmp_path / "cyc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import X\n")
    (pkg / "b.py").write_text("from . import a\nX = 1\n")
    (pkg / "c.py").write_text("Y = 2\n")

    failed = import_each(tmp_path, "cyc", workers=1)

    assert set(failed) == {"cyc.b"}
    assert "ImportError" in failed["cyc.b"] and "partially initialized" in failed["cyc.b"]
