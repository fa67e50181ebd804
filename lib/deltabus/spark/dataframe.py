"""Publishing a Spark DataFrame into a topic as one Delta commit."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidArgument
from ..storage.arrow import plain
from ..storage.tables import STR_MAP
from ..validation import check_arrow

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

ALLOWED = {"data", "attributes", "ordering_key"}


def dataframe_to_arrow(df: "DataFrame") -> pa.Table:
    """Columns data (binary or string), optional attributes (map<string,string>), optional ordering_key (string)."""
    from pyspark.sql import types as T

    fields = {f.name: f.dataType for f in df.schema.fields}
    unknown = set(fields) - ALLOWED
    if unknown:
        raise InvalidArgument("dataframe", f"unexpected columns {sorted(unknown)}; allowed: data, attributes, ordering_key")
    if "data" not in fields:
        raise InvalidArgument("dataframe.data", "a 'data' column (binary or string) is required")
    if not isinstance(fields["data"], (T.BinaryType, T.StringType)):
        raise InvalidArgument("dataframe.data", f"must be binary or string, got {fields['data'].simpleString()}")
    if "attributes" in fields:
        t = fields["attributes"]
        if not (isinstance(t, T.MapType) and isinstance(t.keyType, T.StringType) and isinstance(t.valueType, T.StringType)):
            raise InvalidArgument("dataframe.attributes", f"must be map<string,string>, got {t.simpleString()}")
    if "ordering_key" in fields and not isinstance(fields["ordering_key"], T.StringType):
        raise InvalidArgument("dataframe.ordering_key", f"must be string, got {fields['ordering_key'].simpleString()}")

    table = plain(df.toArrow())
    n = table.num_rows
    data = table["data"]
    if pa.types.is_string(data.type):
        data = pc.cast(data, pa.binary())
    data = data.fill_null(b"")
    attrs = table["attributes"].cast(STR_MAP) if "attributes" in fields else pa.nulls(n, STR_MAP)
    okey = table["ordering_key"].fill_null("") if "ordering_key" in fields else pa.array([""] * n, pa.string())
    out = pa.table({"data": data, "attributes": attrs, "ordering_key": okey})
    size = check_arrow(out)
    return out.append_column("size_bytes", size)
