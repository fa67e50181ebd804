"""The suite's out-of-process runs (tests/background.py) report each test's own outcome: a test
that fails there fails here, with its text; one skipped there is skipped here."""

from __future__ import annotations

import pytest

from tests import background

pytest_plugins = ["pytester"]

PROBE = '''
import os
import pytest

OUT_OF_PROCESS = True


def test_runs_in_a_process_of_its_own():
    assert os.environ.get("DELTABUS_TEST_INNER") == "1"


def test_fails_with_its_own_text():
    print("seen in the failure")
    assert 1 == 2, "one is not two"


@pytest.mark.parametrize("word", ["a", "b c"])
def test_parametrized(word):
    assert word == "a"


def test_skips():
    pytest.skip("the reason given")


@pytest.fixture
def broken():
    raise RuntimeError("the fixture broke")


def test_setup_error(broken):
    pass


class TestInAClass:
    def test_method(self, tmp_path):
        assert tmp_path.is_dir()
'''

CRASH = '''
import os
import pytest

OUT_OF_PROCESS = True


@pytest.fixture
def dies_after():
    yield
    os._exit(0)


def test_teardown_kills_the_run(dies_after):
    pass
'''

IN_PLACE = '''
def test_here():
    import os
    assert "DELTABUS_TEST_INNER" not in os.environ
'''


@pytest.fixture
def session_dir(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A directory for a child session with this suite's lanes (tests/background.py)."""
    monkeypatch.delenv(background.INNER, raising=False)  # this test may itself run in such a run
    monkeypatch.setenv("PYTHONPATH", str(background.ROOT))
    pytester.makeconftest("from tests.conftest import pytest_collection_modifyitems, early_background, "
                          "_start_early_background, pytest_terminal_summary\n")
    return pytester


def test_each_test_of_an_out_of_process_run_gets_its_own_outcome(session_dir: pytest.Pytester) -> None:
    pytester = session_dir
    pytester.makepyfile(test_probe=PROBE, test_in_place=IN_PLACE, test_crash=CRASH)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", "-o", "addopts=")
    result.assert_outcomes(passed=4, failed=4, skipped=1)
    text = result.stdout.str()
    for line in ("PASSED test_probe.py::test_runs_in_a_process_of_its_own",
                 "PASSED test_probe.py::test_parametrized[a]",
                 "FAILED test_probe.py::test_parametrized[b c]",
                 "PASSED test_probe.py::TestInAClass::test_method",
                 "FAILED test_probe.py::test_setup_error",
                 "PASSED test_in_place.py::test_here"):
        assert line in text, line
    assert "AssertionError: one is not two" in text and "seen in the failure" in text
    assert "RuntimeError: the fixture broke" in text and "the reason given" in text
    assert "out of process: test_probe" in text  # the background summary names the run
    # The run died in the test's teardown: no teardown report, so no pass.
    assert "FAILED test_crash.py::test_teardown_kills_the_run" in text
    assert "did not complete in the out of process: test_crash run" in text


def test_a_module_whose_marks_would_apply_to_its_stand_ins_is_refused(session_dir: pytest.Pytester) -> None:
    pytester = session_dir
    pytester.makepyfile(test_strict="import pytest\nOUT_OF_PROCESS = True\npytestmark = pytest.mark.xfail(strict=True)\n\n"
                        "def test_passes():\n    pass\n", test_other="def test_other():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "addopts=")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "OUT_OF_PROCESS modules cannot have module or class marks ['xfail']" in result.stderr.str()


def test_a_session_of_only_out_of_process_tests_runs_them_in_place(session_dir: pytest.Pytester) -> None:
    pytester = session_dir
    pytester.makepyfile(test_probe="OUT_OF_PROCESS = True\n\ndef test_here():\n"
                        "    import os\n    assert 'DELTABUS_TEST_INNER' not in os.environ\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "addopts=").assert_outcomes(passed=1)


def test_a_scenario_still_queued_starts_at_once_when_its_test_asks(tmp_path) -> None:
    import threading

    lanes = background.Scenarios(parallel=1, steal=True)
    release = threading.Event()
    ran_in: dict[str, str] = {}

    def slow(tmp):
        ran_in["slow"] = threading.current_thread().name
        assert release.wait(30)
        return "slow done"

    def queued(tmp):
        ran_in["queued"] = threading.current_thread().name
        raise ValueError("queued failed")

    lanes.start("slow", slow, tmp_path)
    lanes.start("queued", queued, tmp_path)
    while "slow" not in ran_in:  # the slow one holds the only slot
        threading.Event().wait(0.01)
    with pytest.raises(ValueError, match="queued failed"):
        lanes.result("queued")  # does not wait for the slot: runs here
    assert ran_in["queued"] == "scenario-queued-now" and lanes.run_beside_the_lane == ["queued"]
    release.set()
    assert lanes.result("slow") == "slow done" and ran_in["slow"] == "scenario-slow"
    lanes.join_all(10)
    assert [name for name, _, _ in lanes.timeline()] == ["slow", "queued"]


def test_a_test_waiting_for_a_running_scenario_starts_the_last_queued_one_beside_the_lane(tmp_path) -> None:
    import threading

    lanes = background.Scenarios(parallel=1, steal=True)
    release = threading.Event()
    ran_in: dict[str, str] = {}

    def record(name, wait=False):
        def scenario(tmp):
            ran_in[name] = threading.current_thread().name
            if wait:
                assert release.wait(30)
            return name
        return scenario

    lanes.start("first", record("first", wait=True), tmp_path)
    for name in ("second", "third", "last"):
        lanes.start(name, record(name), tmp_path)
    while "first" not in ran_in:
        threading.Event().wait(0.01)
    threading.Timer(2.0, release.set).start()  # the wait below outlasts a few of its polls
    assert lanes.result("first") == "first"
    # While it waited, the test started queued scenarios from the back, one at a time.
    beside = lanes.run_beside_the_lane
    assert beside and beside == ["last", "third", "second"][:len(beside)]
    assert all(ran_in[n] == f"scenario-{n}-now" for n in beside)
    assert [lanes.result(n) for n in ("second", "third", "last")] == ["second", "third", "last"]
    lanes.join_all(10)
    assert sorted(n for n, _, _ in lanes.timeline()) == ["first", "last", "second", "third"]  # each ran once


EARLY_A = '''
BACKGROUND = {"test_a_waits": lambda tmp: None}


def test_a_first():
    pass


def test_a_waits():
    pass


def test_a_last():
    pass
'''

EARLY_B = '''
BACKGROUND = {"scenario b": lambda tmp: None}
BACKGROUND_TESTS = {"scenario b": {"test_b_waits"}}


def test_b_waits():
    pass


def test_b_alone():
    pass
'''


def test_tests_that_wait_for_a_scenario_run_after_every_test_that_does_not(session_dir: pytest.Pytester) -> None:
    pytester = session_dir
    pytester.makepyfile(test_early_a=EARLY_A, test_early_b=EARLY_B, test_plain="def test_plain():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "addopts=", "--collect-only", "-q")
    order = [line.split("::")[1] for line in result.stdout.lines if "::" in line]
    assert order == ["test_plain", "test_a_first", "test_a_last", "test_b_alone", "test_a_waits", "test_b_waits"]


def test_waiting_tests_run_at_most_beside_scenarios_beside_the_lane_at_once(tmp_path) -> None:
    import threading

    lanes = background.Scenarios(parallel=1, steal=True, beside=2)
    release = threading.Event()
    running: set[str] = set()
    most: list[int] = [0]
    lock = threading.Lock()

    def held(name):
        def scenario(tmp):
            with lock:
                running.add(name)
                most[0] = max(most[0], len(running))
            try:
                assert release.wait(30)
            finally:
                with lock:
                    running.discard(name)
            return name
        return scenario

    for name in ("lane", "a", "b", "c", "d"):
        lanes.start(name, held(name), tmp_path)
    while "lane" not in running:
        threading.Event().wait(0.01)
    threading.Timer(3.0, release.set).start()  # several polls of the wait below
    assert lanes.result("lane") == "lane"
    # The lane's one and two beside it, taken from the back; never a third beside.
    assert most[0] == 3 and lanes.run_beside_the_lane[:2] == ["d", "c"]
    assert [lanes.result(n) for n in ("a", "b", "c", "d")] == ["a", "b", "c", "d"]
    lanes.join_all(10)
