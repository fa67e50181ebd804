"""Every notebook runs top to bottom, quietly, cleans up after itself, draws charts a reader
can read, and is committed without outputs.

Each notebook is executed once per test session (a kernel, a SparkSession and a push job take
most of a minute, 47 s and 41 s on the CI-like run), in the background from the session's first
test on (tests/background.py); the tests then look at its outputs and at its figure, which a
probe cell appended to the executed copy describes as JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

from tests import background
from tests.conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

pytestmark = pytest.mark.spark

PROBE_MARK = "@@probe@@"
PROBE = r'''
import json as _json, matplotlib.colors as _mc

def _axes(f):
    out = []
    for ax in f.axes:
        legend = ax.get_legend()
        out.append({
            "title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
            "lines": [{"label": l.get_label(), "x": [float(v) for v in l.get_xdata(orig=False)], "y": [float(v) for v in l.get_ydata(orig=False)],
                       "style": [_mc.to_hex(l.get_color()), l.get_linestyle(), str(l.get_marker())]} for l in ax.get_lines()],
            "spans": [{"label": p.get_label(), "x": [float(v) for v in p.get_patch_transform().transform(p.get_path().vertices)[:, 0]]}
                      for p in ax.patches],
            "legend": [t.get_text() for t in legend.get_texts()] if legend else [],
        })
    return out

print("@@probe@@" + _json.dumps({
    "warehouse": str(warehouse),
    "axes": _axes(fig),
    "first_push": globals().get("first_push"),
    "samples": [list(s) for s in globals().get("samples", [])],
}))
'''

# The JVM prints this itself when Spark's launcher adds the vector module (Spark 4.1 always
# does); it is not a Spark log line and no setting silences it.
JVM_NOTICE = "WARNING: Using incubator modules: jdk.incubator.vector"

# deltabus's own log lines, as the notebooks format them (the push job warns when an endpoint
# fails and it backs off: that is what backlog_explorer is about).
DELTABUS_LOG = re.compile(r"^(INFO|WARNING) deltabus(\.\w+)*: ")


def _text(output: Any) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if output.get("output_type") == "error":
        return "\n".join(output.get("traceback", []))
    return str(output.get("data", {}).get("text/plain", ""))


class Run:
    def __init__(self, nb: Any, probe: dict[str, Any], tmpdir: Path) -> None:
        self.nb, self.probe, self.tmpdir = nb, probe, tmpdir

    @property
    def cells(self) -> list[Any]:
        return [c for c in self.nb.cells[:-1] if c.cell_type == "code"]  # the probe cell left out

    def outputs(self) -> list[Any]:
        return [o for c in self.cells for o in c.outputs]


def execute(path: Path, base: Path) -> Run:
    """`path` executed as a user would open it: no $DELTABUS_WAREHOUSE, and TMPDIR pointed at an
    empty directory so whatever it leaves behind can be seen."""
    tmpdir = base / "tmp"
    tmpdir.mkdir()
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    # The kernel's own environment (not os.environ: other scenarios start beside this one).
    env = {k: v for k, v in background.env().items() if k != "DELTABUS_WAREHOUSE"}
    env["TMPDIR"] = str(tmpdir)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(base)}}).execute(env=env)
    [line] = [ln for o in nb.cells[-1].outputs for ln in _text(o).splitlines() if ln.startswith(PROBE_MARK)]
    return Run(nb, json.loads(line[len(PROBE_MARK):]), tmpdir)


# Each notebook runs once, in the background from the session's first test on
# (tests/background.py), for the tests below that look at its run.
BACKGROUND = {f"notebook {p.name}": (lambda tmp, p=p: execute(p, tmp)) for p in NOTEBOOKS}
RUN_TESTS = {"test_notebook_runs_quietly_and_draws", "test_notebook_removes_its_temporary_warehouse"}
BACKGROUND_TESTS = {
    "notebook backlog_explorer.ipynb": RUN_TESTS | {"test_backlog_explorer_shows_every_subscription_distinguishably"},
    "notebook quickstart.ipynb": RUN_TESTS | {"test_quickstart_marks_the_push_job_start_up"},
}
BACKGROUND_TESTS.update({name: RUN_TESTS for name in BACKGROUND if name not in BACKGROUND_TESTS})


@pytest.fixture
def run(early_background):
    def result(path: Path) -> Run:
        return early_background.result(f"notebook {path.name}")  # type: ignore[no-any-return]

    return result


def _nb(name: str) -> Path:
    return ROOT / "notebooks" / name


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {"quickstart.ipynb", "backlog_explorer.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_outputs_are_stripped(path: Path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip outputs before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_quietly_and_draws(path: Path, run):
    r = run(path)
    assert any("image/png" in o.get("data", {}) for o in r.outputs()), f"{path.name} should draw its chart"
    for i, cell in enumerate(r.cells):
        for o in cell.outputs:
            text = _text(o)
            assert "[Stage" not in text, f"cell {i} shows Spark's progress bar:\n{text[:500]}"
            assert not re.search(r"\bWARN\b", text), f"cell {i} shows a Spark warning:\n{text[:500]}"
            assert o.output_type != "error"
            if o.get("name") == "stderr":
                noise = [ln for ln in text.splitlines() if ln.strip() and ln.strip() != JVM_NOTICE and not DELTABUS_LOG.match(ln)]
                assert not noise, f"cell {i} writes to stderr:\n" + "\n".join(noise[:20])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_removes_its_temporary_warehouse(path: Path, run):
    r = run(path)
    warehouse = Path(r.probe["warehouse"])
    assert warehouse.parent == r.tmpdir, "without $DELTABUS_WAREHOUSE the notebook works in a temporary warehouse"
    assert not warehouse.exists()
    assert list(r.tmpdir.rglob("_delta_log")) == [] and list(r.tmpdir.iterdir()) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_endpoints_are_used_through_public_start_stop_or_with(path: Path):
    source = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    assert "__enter__" not in source and "__exit__" not in source
    for name in re.findall(r"(\w+) = LocalEndpoint\([^)]*\)\.start\(\)", source):
        assert f"{name}.stop()" in source, f"{path.name}: {name} is started but never stopped"


def _every_axis_is_labelled(axes: list[dict[str, Any]]) -> None:
    for ax in axes:
        assert ax["xlabel"].strip() and ax["ylabel"].strip(), f"axes {ax['title']!r} lacks an axis label"


def _step(x: np.ndarray, y: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The value a steps-post (or any) line shows at `at`: the last point at or before it."""
    return y[np.clip(np.searchsorted(x, at, side="right") - 1, 0, len(y) - 1)]


def _drawn_on_top_of_each_other(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two lines of one axes that show the same values over (nearly) all their common x range,
    so one hides the other whatever their styles. (Lines that merely meet, such as acked and
    nacked counts both at 0 before the first push, are fine.)"""
    xa, ya = np.asarray(a["x"], float), np.asarray(a["y"], float)
    xb, yb = np.asarray(b["x"], float), np.asarray(b["y"], float)
    if len(xa) < 2 or len(xb) < 2 or xa[0] == xa[-1] or xb[0] == xb[-1]:
        return False  # a marker line (axvline), not a series
    lo, hi = max(xa.min(), xb.min()), min(xa.max(), xb.max())
    at = np.union1d(xa, xb)
    at = at[(at >= lo) & (at <= hi)]
    if len(at) < 2:
        return False
    return float(np.mean(np.isclose(_step(xa, ya, at), _step(xb, yb, at)))) >= 0.9


def test_backlog_explorer_shows_every_subscription_distinguishably(run):
    axes = run(_nb("backlog_explorer.ipynb")).probe["axes"]
    _every_axis_is_labelled(axes)
    for ax in axes:
        lines = ax["lines"]
        for i, a in enumerate(lines):
            for b in lines[i + 1:]:
                assert a["style"] != b["style"], f"{ax['title']!r}: {a['label']!r} and {b['label']!r} look alike"
                assert not _drawn_on_top_of_each_other(a, b), f"{ax['title']!r}: {a['label']!r} hides {b['label']!r}"
    for name in ("healthy-push", "failing-push", "stuck-pull"):
        shown = [ax for ax in axes if name in ax["title"] and ax["lines"]]
        assert shown, f"no visible series for {name}"
    [failing_unacked] = [ax for ax in axes if "failing-push" in ax["title"]]
    [stuck_unacked] = [ax for ax in axes if "stuck-pull" in ax["title"]]
    assert failing_unacked is not stuck_unacked


def test_quickstart_marks_the_push_job_start_up(run):
    r = run(_nb("quickstart.ipynb"))
    axes, first_push, samples = r.probe["axes"], r.probe["first_push"], r.probe["samples"]
    _every_axis_is_labelled(axes)
    [ax] = axes
    assert first_push is not None and first_push > 0, "the notebook should measure when the first push arrived"
    [marker] = [ln for ln in ax["lines"] if "first push" in ln["label"]]
    assert marker["x"] == [first_push, first_push]
    [span] = [s for s in ax["spans"] if "start-up" in s["label"]]
    assert min(span["x"]) == 0 and max(span["x"]) == pytest.approx(first_push)
    assert any("start-up" in t for t in ax["legend"]) and any("first push" in t for t in ax["legend"])
    # The flat start is exactly the marked start-up: nothing was acked before the first push
    # (samples, taken 4 times a second, drop only after it), and the backlog drains to 0.
    published = samples[0][1]
    assert all(n == published for t, n in samples if t < first_push)
    assert any(n < published for t, n in samples if t >= first_push) and samples[-1][1] == 0
    [drain] = [ln for ln in ax["lines"] if ln["label"] == "unacked messages"]
    assert drain["y"] == [n for _, n in samples]
    words = " ".join(c.source for c in r.nb.cells if c.cell_type == "markdown")
    assert "start-up" in words or "starting up" in words
