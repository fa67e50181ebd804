"""spark-submit.sh binds a driver to 127.0.0.1 only when its master is local: which master is it?"""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import ROOT


def master(tmp_path, *args: str, defaults: str = "spark.master  local[4]\n") -> str:
    props = tmp_path / "spark-defaults.conf"
    props.write_text(defaults)
    out = subprocess.run(
        ["bash", "-c", 'source "$0"; spark_master "$@"', str(ROOT / "scripts" / "spark_master.sh"), str(props), *args],
        capture_output=True, text=True, check=True,
    )
    return out.stdout.strip()


@pytest.mark.parametrize(
    "args, expected",
    [
        ([], "local[4]"),  # conf/spark-defaults.conf
        (["--master", "yarn", "jobs/deliver.py"], "yarn"),
        (["--master=spark://h:7077", "jobs/deliver.py"], "spark://h:7077"),
        (["--conf", "spark.master=yarn", "jobs/deliver.py"], "yarn"),  # was taken as local[4]: a cluster driver on loopback
        (["--conf=spark.master=k8s://https://k:443", "jobs/deliver.py"], "k8s://https://k:443"),
        (["--conf", "spark.master=yarn", "--master", "local[2]", "jobs/deliver.py"], "local[2]"),  # --master wins, as in spark-submit
        (["jobs/deliver.py", "--master", "yarn"], "local[4]"),  # the job's own arguments are not spark-submit's
        (["--conf", "spark.app.name=x", "jobs/deliver.py"], "local[4]"),
    ],
)
def test_the_master_is_the_one_spark_submit_uses(tmp_path, args, expected):
    assert master(tmp_path, *args) == expected


def test_a_properties_file_replaces_the_defaults(tmp_path):
    other = tmp_path / "cluster.conf"
    other.write_text("spark.master yarn\n")
    assert master(tmp_path, "--properties-file", str(other), "jobs/deliver.py") == "yarn"
