"""bench/chaos.py's reading of the client processes' records: which acknowledge calls a kill cut."""

import json
from pathlib import Path

from bench.chaos import _read_client_records


def write(path: Path, *records: dict) -> None:
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def test_only_the_last_call_of_a_run_counts_as_cut(tmp_path):
    f = tmp_path / "1-puller.jsonl"
    write(f, {"e": "start", "pid": 1, "role": "puller"},
          {"e": "recv", "ids": ["a"], "t": 2.0, "called": 1.0, "deadline": 10},
          {"e": "ack-call", "ids": ["a"]}, {"e": "ack", "ids": ["a"], "t": 3.0},
          {"e": "recv", "ids": ["b", "c"], "t": 4.0, "called": 3.5, "deadline": 10},
          {"e": "ack-call", "ids": ["b", "c"]})  # killed here
    write(f, {"e": "start", "pid": 2, "role": "puller"},
          {"e": "recv", "ids": ["d"], "t": 6.0, "called": 5.0, "deadline": 10},
          {"e": "ack-call", "ids": ["d"]})  # and here, at the file's end
    (tmp_path / "0-publisher.jsonl").write_text(json.dumps({"e": "pub", "ids": ["a", "b", "c", "d"]}) + "\n{\"e\": \"pu")
    got = _read_client_records(tmp_path)
    assert got.published == {"a", "b", "c", "d"}
    assert got.ack_called == {"b", "c", "d"} and got.cut_ack_calls == 2
    assert [a.message_id for a in got.acks] == ["a"] and got.errors == 0
    assert len(got.receipts) == 4


def test_a_call_without_its_return_mid_run_is_an_error_not_an_ack(tmp_path):
    write(tmp_path / "1-puller.jsonl", {"e": "start", "pid": 1, "role": "puller"},
          {"e": "ack-call", "ids": ["a"]}, {"e": "ack-call", "ids": ["b"]}, {"e": "ack", "ids": ["b"], "t": 1.0})
    got = _read_client_records(tmp_path)
    assert got.ack_called == set() and got.cut_ack_calls == 0
    assert got.errors == 1


def test_a_line_cut_by_a_kill_does_not_hide_the_next_runs_start(tmp_path):
    f = tmp_path / "1-puller.jsonl"
    write(f, {"e": "start", "pid": 1, "role": "puller"}, {"e": "ack-call", "ids": ["a"]})
    with open(f, "a") as out:
        out.write('{"e": "ack", "ids": ["a"], "t"')  # cut mid-line by the kill
        out.write("\n")  # what the next run writes first (chaos_client.Records.newline)
    write(f, {"e": "start", "pid": 2, "role": "puller"}, {"e": "ack-call", "ids": ["b"]}, {"e": "ack", "ids": ["b"], "t": 2.0})
    got = _read_client_records(tmp_path)
    assert got.ack_called == {"a"} and got.cut_ack_calls == 1 and got.errors == 0


def test_files_without_start_records_keep_the_old_rule(tmp_path):
    write(tmp_path / "1-puller.jsonl", {"e": "ack-call", "ids": ["a"]}, {"e": "ack-call", "ids": ["b"]},
          {"e": "ack", "ids": ["b"], "t": 1.0}, {"e": "ack-call", "ids": ["c"]})
    got = _read_client_records(tmp_path)
    assert got.ack_called == {"a", "c"} and got.errors == 0


def test_the_client_library_s_own_shutdown_race_is_not_counted_but_any_other_traceback_is(tmp_path):
    from bench.chaos import _unexpected

    race = """Thread-ConsumeBidirectionalStream caught unexpected exception  and will exit.
Traceback (most recent call last):
  File "site-packages/google/api_core/bidi.py", line 647, in _thread_main
    self._on_response(response)
  File "site-packages/google/cloud/pubsub_v1/subscriber/_protocol/streaming_pull_manager.py", line 703, in _schedule_message_on_hold
    assert self._scheduler is not None
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^
AssertionError
"""
    other = """Traceback (most recent call last):
  File "bench/chaos_client.py", line 1, in run
    raise RuntimeError("boom")
RuntimeError: boom
"""
    err = tmp_path / "4-grpc-subscriber.err"
    err.write_text(race)
    assert _unexpected(err) == 0
    err.write_text(race + other)
    assert _unexpected(err) == 1
