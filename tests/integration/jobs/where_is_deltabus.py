"""Run through ./spark-submit.sh by a test: where do executors import deltabus from?"""

import os

from pyspark.sql import SparkSession


def where(_):
    import deltabus

    yield deltabus.__file__


spark = SparkSession.builder.getOrCreate()
print("EXECUTOR", spark.sparkContext.parallelize([0, 1], 2).mapPartitions(where).collect())
print("CONF", os.environ.get("DELTABUS_CONF"))
spark.stop()
