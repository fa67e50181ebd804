"""Input rules checked before anything is written: Pub/Sub's message limits, push endpoints."""

from __future__ import annotations

import collections.abc
import ipaddress
import re
from typing import TYPE_CHECKING, Any, Mapping
from urllib.parse import urlsplit

from .errors import InvalidArgument

if TYPE_CHECKING:  # for annotations only; check_arrow imports pyarrow when it runs, as before
    import pyarrow as pa

MAX_DATA_BYTES = 10_000_000
MAX_ATTRIBUTES = 100
MAX_ATTRIBUTE_KEY_BYTES = 256
MAX_ATTRIBUTE_VALUE_BYTES = 1024
MAX_ORDERING_KEY_BYTES = 1024


def _utf8_len(text: str, field: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument(field, "must be valid Unicode text (no lone surrogates)") from None


def check_message(data: Any, attributes: Any, ordering_key: Any, where: str = "message") -> int:
    """Validate one message; return its size in bytes. Raise InvalidArgument naming the field."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgument(f"{where}.data", f"must be bytes, got {type(data).__name__} (encode text first)")
    size = memoryview(data).nbytes  # bytes, whatever the item size of a memoryview
    if size > MAX_DATA_BYTES:
        raise InvalidArgument(f"{where}.data", f"must be at most {MAX_DATA_BYTES} bytes, got {size}")
    if attributes is None:
        attributes = {}
    # (a dict first: typing.Mapping's isinstance goes through typing's __instancecheck__;
    # measured, check_message of a 1 KB message with one attribute 1.14 -> 0.83 us)
    if type(attributes) is not dict and not isinstance(attributes, collections.abc.Mapping):
        raise InvalidArgument(f"{where}.attributes", f"must map strings to strings, got {type(attributes).__name__}")
    if len(attributes) > MAX_ATTRIBUTES:
        raise InvalidArgument(f"{where}.attributes", f"at most {MAX_ATTRIBUTES} attributes, got {len(attributes)}")
    for k, v in attributes.items():
        if not isinstance(k, str):
            raise InvalidArgument(f"{where}.attributes", f"keys must be strings, got {type(k).__name__}")
        if not isinstance(v, str):
            raise InvalidArgument(f"{where}.attributes[{k!r}]", f"values must be strings, got {type(v).__name__}")
        kb = _utf8_len(k, f"{where}.attributes")
        if kb == 0:
            raise InvalidArgument(f"{where}.attributes", "keys must not be empty")
        if kb > MAX_ATTRIBUTE_KEY_BYTES:
            raise InvalidArgument(f"{where}.attributes", f"keys must be at most {MAX_ATTRIBUTE_KEY_BYTES} bytes, got {kb}")
        if k.startswith("goog"):
            raise InvalidArgument(f"{where}.attributes[{k!r}]", "keys starting with 'goog' are reserved")
        vb = _utf8_len(v, f"{where}.attributes[{k!r}]")
        if vb > MAX_ATTRIBUTE_VALUE_BYTES:
            raise InvalidArgument(f"{where}.attributes[{k!r}]", f"values must be at most {MAX_ATTRIBUTE_VALUE_BYTES} bytes, got {vb}")
        size += kb + vb
    if size == 0 and not attributes:
        raise InvalidArgument(where, "a message needs non-empty data or at least one attribute")
    if ordering_key is None:
        ordering_key = ""
    if not isinstance(ordering_key, str):
        raise InvalidArgument(f"{where}.ordering_key", f"must be a string, got {type(ordering_key).__name__}")
    okb = _utf8_len(ordering_key, f"{where}.ordering_key")
    if okb > MAX_ORDERING_KEY_BYTES:
        raise InvalidArgument(f"{where}.ordering_key", f"must be at most {MAX_ORDERING_KEY_BYTES} bytes, got {okb}")
    return size


def check_arrow(table: "pa.Table", where: str = "dataframe") -> "pa.Array":
    """Validate a table of data (binary), attributes (map<string,string>), ordering_key (string).

    Vectorised version of check_message for DataFrames; returns each row's size in bytes.
    Raises InvalidArgument naming the column, the rule and the first offending row.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    def first_bad(mask: "pa.Array") -> int:
        return int(np.flatnonzero(np.asarray(mask.fill_null(False)))[0])

    n = table.num_rows
    data = table["data"].combine_chunks()
    data_len = pc.binary_length(data).fill_null(0)
    too_big = pc.greater(data_len, MAX_DATA_BYTES)
    if pc.any(too_big).as_py():
        i = first_bad(too_big)
        raise InvalidArgument(f"{where}.data[row {i}]", f"must be at most {MAX_DATA_BYTES} bytes, got {data_len[i].as_py()}")

    attrs = table["attributes"].combine_chunks()
    offsets = np.asarray(attrs.offsets, dtype=np.int64)
    counts = pa.array(np.diff(offsets), pa.int64())  # null maps have zero entries
    too_many = pc.greater(counts, MAX_ATTRIBUTES)
    if pc.any(too_many).as_py():
        i = first_bad(too_many)
        raise InvalidArgument(f"{where}.attributes[row {i}]", f"at most {MAX_ATTRIBUTES} attributes, got {counts[i].as_py()}")
    attr_bytes = np.zeros(n, dtype=np.int64)
    if offsets[-1] > offsets[0]:
        parents = np.repeat(np.arange(n), np.asarray(counts))
        keys = attrs.keys.slice(offsets[0], offsets[-1] - offsets[0])
        values = attrs.items.slice(offsets[0], offsets[-1] - offsets[0])
        key_len = pc.binary_length(keys)
        bad_checks = [
            (pc.equal(key_len, 0), "keys must not be empty"),
            (pc.greater(key_len, MAX_ATTRIBUTE_KEY_BYTES), f"keys must be at most {MAX_ATTRIBUTE_KEY_BYTES} bytes"),
            (pc.starts_with(keys, "goog"), "keys starting with 'goog' are reserved"),
            (pc.is_null(values), "values must not be null"),
            (pc.greater(pc.binary_length(values), MAX_ATTRIBUTE_VALUE_BYTES), f"values must be at most {MAX_ATTRIBUTE_VALUE_BYTES} bytes"),
        ]
        for mask, rule in bad_checks:
            if pc.any(mask).as_py():
                j = first_bad(mask)
                raise InvalidArgument(f"{where}.attributes[row {int(parents[j])}][{keys[j].as_py()!r}]", rule)
        per_entry = np.asarray(key_len, dtype=np.int64) + np.asarray(pc.binary_length(values).fill_null(0), dtype=np.int64)
        attr_bytes = np.bincount(parents, weights=per_entry, minlength=n).astype(np.int64)
    size = np.asarray(data_len, dtype=np.int64) + attr_bytes
    empty = (size == 0) & (np.asarray(counts) == 0)
    if empty.any():
        i = int(np.flatnonzero(empty)[0])
        raise InvalidArgument(f"{where}[row {i}]", "a message needs non-empty data or at least one attribute")

    okey = table["ordering_key"].combine_chunks()
    okey_len = pc.binary_length(okey).fill_null(0)
    too_long = pc.greater(okey_len, MAX_ORDERING_KEY_BYTES)
    if pc.any(too_long).as_py():
        i = first_bad(too_long)
        raise InvalidArgument(f"{where}.ordering_key[row {i}]", f"must be at most {MAX_ORDERING_KEY_BYTES} bytes")
    return pa.array(size, pa.int64())


# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens, 1..63
# characters each, 253 in all (an international name is checked in its IDNA form).
_HOST_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_WHITESPACE = re.compile(r"[\s\x00-\x1f\x7f]")


def endpoint_scheme(url: str) -> str:
    """The URL's scheme, lower-cased: schemes are case-insensitive (RFC 3986 3.1), and yarl
    accepts ``HTTP://``, so every http/https decision goes through this, never startswith."""
    head, sep, _ = url.partition(":")
    return head.lower() if sep else ""


def check_push_endpoint(url: str, field: str = "push_config.push_endpoint") -> str:
    """An absolute http(s) URL with a valid host name or IP address, a port of 1..65535 and
    no user info, fragment or whitespace; return it unchanged.

    Parsed with yarl (aiohttp's own URL type, so the rule matches what the push job will
    connect to); yarl parses leniently ("https://a b/" has host "a b"), so the host is then
    checked here.
    """
    import yarl

    # Errors echo the URL without its query, which may carry a token (Pub/Sub allows ?token=).
    shown = url.split("?", 1)[0] + ("?…" if "?" in url else "")

    def bad(rule: str) -> InvalidArgument:
        return InvalidArgument(field, f"{rule}, got {shown!r}")

    if _WHITESPACE.search(url):
        raise bad("must not contain whitespace or control characters")
    try:
        parsed = yarl.URL(url)
        port = parsed.explicit_port
    except (ValueError, UnicodeError) as exc:
        if "port" in str(exc).lower():
            raise bad("the port must be a number 1..65535") from None
        raise bad(f"must be a valid URL ({exc})") from None
    if parsed.scheme not in ("http", "https"):
        raise bad("must be an http or https URL")
    host = parsed.raw_host
    if not parsed.is_absolute() or not host:
        raise bad("must be an absolute URL with a host")
    if "@" in urlsplit(url).netloc:  # not echoed: it may hold a password
        raise InvalidArgument(field, "must not carry user:password@ (it would be stored and shown in plain text; use oidc_token)")
    if "#" in url:
        raise bad("must not have a #fragment (it is never sent)")
    if port is not None and not 1 <= port <= 65535:
        raise bad("the port must be a number 1..65535")
    _check_host(host, bad)
    return url


def _check_host(host: str, bad: Any) -> None:
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    name = host[:-1] if host.endswith(".") else host
    labels = name.split(".")
    if len(name) > 253 or not all(_HOST_LABEL.match(label) for label in labels):
        raise bad("the host must be a valid host name (letters, digits, '-' and dots) or an IP address")
    if labels[-1].isdigit():
        raise bad("the host must be a valid IP address")
