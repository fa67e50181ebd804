"""What our spark-submit jobs print: our own lines and real problems by default, more with --verbose.

By default Spark logs warnings and errors (``conf/log4j2.properties``, which also silences
the warnings our own settings cause, each by its logger or message), progress bars are off
(``conf/spark-defaults.conf``: they interleave with log lines) and deltabus logs at
`default_level`. ``--verbose`` turns on Spark's INFO (including the loggers silenced in the
file), deltabus's DEBUG and the console progress bars.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def python_logging(verbose: bool, default_level: int = logging.INFO) -> None:
    """Our loggers on stdout; the libraries we call stay at WARNING."""
    logging.basicConfig(level=logging.WARNING, format=FORMAT, stream=sys.stdout)
    logging.getLogger("deltabus").setLevel(logging.DEBUG if verbose else default_level)


def session_options(builder: Any, verbose: bool) -> Any:
    """Builder options, set before the SparkContext exists (the progress bar is made with it)."""
    if verbose:  # spark.log.level: Spark's root logger at INFO from the SparkContext's start
        builder = builder.config("spark.ui.showConsoleProgress", "true").config("spark.log.level", "INFO")
    return builder


def spark_logging(spark: Any, verbose: bool) -> None:
    """With `verbose`, Spark's loggers at INFO, including the ones conf/log4j2.properties silences."""
    if not verbose:
        return
    jvm = spark.sparkContext._jvm
    level = jvm.org.apache.logging.log4j.Level.INFO
    jvm.org.apache.logging.log4j.core.config.Configurator.setAllLevels("org.apache.spark", level)
