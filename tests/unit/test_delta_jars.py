"""The delta-spark jar plan: which spark-submit lines get the Delta jars and settings (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltabus import config
from deltabus.errors import InvalidArgument
from deltabus.spark.delta_jars import IVY_SETTINGS, SESSION_CONFS, Package, SubmitLine, cached, plan_submit

# Sets DELTABUS_* variables to values clients refuse: runs before the early scenarios start
# (tests/background.py), whose in-process clients read them.
CHANGES_ENVIRONMENT = True

JARS = [Path("/cache/d/delta-spark.jar"), Path("/cache/d/delta-storage.jar")]
EXT = [f"{k}={v}" for k, v in SESSION_CONFS.items()]


def plan(args: list[str], engine: str = "auto", tmp: Path = Path("/nonexistent")) -> tuple[list[str], int]:
    calls = []

    def jars() -> list[Path]:
        calls.append(1)
        return JARS

    return plan_submit(args, engine, jars=jars, ivy_settings=tmp / "ivysettings.xml"), len(calls)


def test_the_shipped_conf_pins_one_package_for_spark_4_1():
    package = Package.parse(config.delta_package(config.default_path()))
    assert package.group == "io.delta" and package.artifact == "delta-spark_4.1_2.13"


@pytest.mark.parametrize("raw", ["io.delta:delta-spark", "a:b:c:d", "io.delta::4.4.0", "io delta:x:1", ""])
def test_bad_coordinates_name_the_setting(raw):
    with pytest.raises(InvalidArgument, match=r"\[delta-spark\] package"):
        Package.parse(raw)


def test_delta_rs_and_auto_pass_through_untouched_and_fetch_nothing():
    line = ["--master", "local[2]", "--jars", "x.jar", "jobs/deliver.py", "--engine", "delta-rs"]
    assert plan(line) == (line, 0)
    assert plan(["jobs/quickstart.py"], engine="auto") == (["jobs/quickstart.py"], 0)


def test_asking_for_delta_spark_adds_the_jars_and_the_session_settings():
    out, fetched = plan(["--master", "local[4]", "jobs/deliver.py", "--warehouse", "w", "--engine", "delta-spark"])
    assert fetched == 1
    assert out[:2] == ["--master", "local[4]"]
    assert out[out.index("--jars") + 1] == ",".join(map(str, JARS))
    assert [out[i + 1] for i, a in enumerate(out) if a == "--conf"] == EXT
    assert out[-5:] == ["jobs/deliver.py", "--warehouse", "w", "--engine", "delta-spark"]  # job args last, unchanged


def test_the_setting_asks_when_the_job_has_no_flag_and_the_flag_wins():
    assert plan(["jobs/deliver.py"], engine="delta-spark")[1] == 1
    assert plan(["jobs/deliver.py", "--engine=delta-rs"], engine="delta-spark")[1] == 0


def test_the_users_jars_are_kept_in_the_one_jars_option_and_their_settings_win():
    out, _ = plan(["--jars", "/u/a.jar", "--conf", "spark.sql.extensions=my.Ext", "jobs/deliver.py", "--engine", "delta-spark"])
    assert out.count("--jars") == 1
    assert out[out.index("--jars") + 1].split(",") == ["/u/a.jar", *map(str, JARS)]
    assert "spark.sql.extensions=my.Ext" in out and f"spark.sql.extensions={SESSION_CONFS['spark.sql.extensions']}" not in out


def test_a_line_bringing_delta_gets_the_settings_and_our_ivy_settings(tmp_path):
    line = ["--packages", "io.delta:delta-spark_4.1_2.13:4.4.0", "jobs/deliver.py", "--engine", "delta-spark"]
    out, fetched = plan(line, tmp=tmp_path)
    assert fetched == 0 and "--jars" not in out
    assert f"spark.jars.ivySettings={tmp_path / 'ivysettings.xml'}" in out
    assert (tmp_path / "ivysettings.xml").read_text() == IVY_SETTINGS
    assert all(e in out for e in EXT)
    own = ["--conf", "spark.jars.ivySettings=/mine.xml", *line]
    assert plan(own, tmp=tmp_path)[0].count("--conf") == 1 + len(EXT)  # theirs kept, ours not added


def test_the_application_is_found_past_options_with_jar_values():
    line = SubmitLine.split(["--jars", "a.jar", "--verbose", "--conf", "k=v", "jobs/x.py", "--conf", "job-flag"])
    assert line.application == ("jobs/x.py", "--conf", "job-flag")
    assert line.confs() == {"k": "v"}


def test_cached_is_none_until_a_directory_of_jars_exists(tmp_path):
    package = Package("io.delta", "delta-spark_4.1_2.13", "4.4.0")
    assert cached(package, tmp_path) is None
    (tmp_path / package.dirname).mkdir()
    assert cached(package, tmp_path) is None
    (tmp_path / package.dirname / "a.jar").write_bytes(b"")
    assert cached(package, tmp_path) == [tmp_path / package.dirname / "a.jar"]


def test_a_cluster_with_delta_installed_gets_only_the_settings():
    out = plan_submit(["jobs/deliver.py", "--engine", "delta-spark"], "auto", jars=None, ivy_settings=Path("/x"))
    assert "--jars" not in out and all(e in out for e in EXT)


def test_the_jobs_own_settings_file_names_the_engine(tmp_path, monkeypatch):
    from deltabus.spark.delta_jars import _engine_setting

    monkeypatch.delenv("DELTABUS_ENGINE", raising=False)  # the variable would override the file

    conf = tmp_path / "job.conf"
    conf.write_text("[deltabus]\nengine = delta-spark\n")
    assert _engine_setting(["--master", "local[2]", "jobs/deliver.py", "--conf", str(conf)]) == "delta-spark"
    conf.write_text("[deltabus]\nengine = hive\n")  # the job reports it; the plan adds nothing
    assert _engine_setting(["jobs/deliver.py", f"--conf={conf}"]) == "auto"
