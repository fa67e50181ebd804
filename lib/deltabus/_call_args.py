"""Call arguments, google-cloud-pubsub style: either ``request={...}`` or keyword fields, never both.

The client methods (publisher and subscriber) take their fields either way; ``fields`` turns
the call into one dict of the fields given and rejects a mix, a non-mapping or unknown names
(``InvalidArgument`` naming ``request``); ``required`` names a missing one. Nothing here is
about HTTP requests (hence no longer ``_requests.py``).
"""

from __future__ import annotations

from typing import Any, Collection, Iterable, Mapping

from .errors import InvalidArgument


def fields(method: str, request: Mapping[str, Any] | None, allowed: set[str], **flat: Any) -> dict[str, Any]:
    given = {k: v for k, v in flat.items() if v is not None}
    if request is None:
        return given
    if given:
        raise InvalidArgument("request", f"{method}: pass either request or keyword fields, not both")
    if not isinstance(request, Mapping):
        raise InvalidArgument("request", f"{method}: must be a dict, got {type(request).__name__}")
    unknown = set(request) - allowed
    if unknown:
        raise InvalidArgument("request", f"{method}: unknown fields {sorted(unknown, key=str)}; known: {sorted(allowed)}")
    return dict(request)


def required(values: Mapping[str, Any], name: str, method: str) -> Any:
    if values.get(name) is None:
        raise InvalidArgument(name, f"{method} requires {name}")
    return values[name]


def mask_paths(values: Mapping[str, Any], updatable: Collection[str], method: str) -> list[str]:
    """The paths of an update call's ``update_mask`` (a list of paths, or Pub/Sub's
    ``{"paths": [...]}``): at least one, each an updatable field, else InvalidArgument
    naming ``update_mask``."""
    mask = required(values, "update_mask", method)
    if isinstance(mask, Mapping):
        mask = mask.get("paths", [])
    if isinstance(mask, str) or not isinstance(mask, Iterable):
        raise InvalidArgument("update_mask", "must be a list of field paths")
    paths = list(mask)
    if not paths:
        raise InvalidArgument("update_mask", f"name at least one field to update: {sorted(updatable)}")
    bad = [p for p in paths if p not in updatable]
    if bad:
        raise InvalidArgument("update_mask", f"cannot update {bad}; updatable fields: {sorted(updatable)}")
    return paths
