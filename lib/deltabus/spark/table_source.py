"""A Spark Python data source reading one deltabus Delta table through delta-rs (batch).

``spark.read.format("deltabus_table").option("table", "messages").load(<table URI>)``.
Spark plans a Python source's partitions once per relation (a view keeps them), so the
plan holds no version: each Spark partition is a fixed hash bucket of Delta partition
values and reads the table's latest version when the query runs. Every query therefore
sees fresh data; buckets may straddle a commit made while the query runs.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from ..storage.engine import literal
from ..storage.tables import BY_NAME

NAME = "deltabus_table"


class TablePartition(InputPartition):
    def __init__(self, uri: str, column: str | None, bucket: int, buckets: int) -> None:
        self.uri = uri
        self.column = column
        self.bucket = bucket
        self.buckets = buckets


class TableReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.uri = options["path"]
        self.spec = BY_NAME[options["table"]]
        self.schema = schema
        self.options_buckets = options.get("buckets", "4")

    def partitions(self) -> Sequence[InputPartition]:
        col = self.spec.partition_column
        if col is None:
            return [TablePartition(self.uri, None, 0, 1)]
        buckets = int(self.options_buckets)
        return [TablePartition(self.uri, col, b, buckets) for b in range(buckets)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        import zlib

        import pyarrow.compute as pc
        from deltalake import DeltaTable

        from ..storage.arrow import dataset, plain, scan_threads

        assert isinstance(partition, TablePartition)
        dt = DeltaTable(partition.uri)  # the latest version, at query time
        flt = None
        prune = None
        if partition.column is not None:
            values = sorted(
                v for v in {pv[partition.column] for pv in dt.partitions()}
                if zlib.crc32(v.encode()) % partition.buckets == partition.bucket
            )
            if not values:
                return
            flt = pc.field(partition.column).isin(values)
            prune = f"{partition.column} IN ({', '.join(literal(v) for v in values)})"
        ds = dataset(dt, partition.uri, prune)
        target = to_arrow_schema(self.schema)
        for batch in ds.to_batches(filter=flt, use_threads=scan_threads(partition.uri)):
            table = plain(pa.Table.from_batches([batch])).select(target.names)
            yield from table.cast(target).to_batches()


class TableSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return from_arrow_schema(BY_NAME[self.options["table"]].schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        return TableReader(self.options, schema)


def register(spark: Any) -> None:
    spark.dataSource.register(TableSource)
