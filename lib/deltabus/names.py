"""Resource names: projects/P/topics/T, projects/P/subscriptions/S and projects/P/snapshots/N."""

from __future__ import annotations

import re
from typing import NamedTuple

from .errors import InvalidArgument

# Pub/Sub's rule for topic and subscription ids.
# \Z, not $: `$` also matches before a final newline, so "abc\n" passed (issue 16's fuzzing).
_RESOURCE_ID = re.compile(r"^(?!goog)[A-Za-z][A-Za-z0-9\-_.~+%]{2,254}\Z")
# Looser than Google's 6..30 lower-case rule, so that short local projects ("local") work.
_PROJECT_ID = re.compile(r"^[A-Za-z][A-Za-z0-9\-_.]{0,62}\Z")

ID_RULE = "must match ^(?!goog)[A-Za-z][A-Za-z0-9\\-_.~+%]{2,254}$ (3..255 chars, start with a letter, not 'goog')"
PROJECT_RULE = "must match ^[A-Za-z][A-Za-z0-9\\-_.]{0,62}$"

DELETED_TOPIC = "_deleted-topic_"


class ResourceName(NamedTuple):
    project: str
    collection: str  # "topics", "subscriptions" or "snapshots"
    resource_id: str

    def __str__(self) -> str:
        return f"projects/{self.project}/{self.collection}/{self.resource_id}"


def _check_project(project: str, field: str) -> None:
    if not isinstance(project, str) or not _PROJECT_ID.match(project):
        raise InvalidArgument(field, f"project id {project!r} {PROJECT_RULE}")


def _check_id(resource_id: str, field: str) -> None:
    if not isinstance(resource_id, str) or not _RESOURCE_ID.match(resource_id):
        raise InvalidArgument(field, f"id {resource_id!r} {ID_RULE}")


def topic_path(project: str, topic: str) -> str:
    _check_project(project, "project")
    _check_id(topic, "topic")
    return f"projects/{project}/topics/{topic}"


def subscription_path(project: str, subscription: str) -> str:
    _check_project(project, "project")
    _check_id(subscription, "subscription")
    return f"projects/{project}/subscriptions/{subscription}"


def snapshot_path(project: str, snapshot: str) -> str:
    _check_project(project, "project")
    _check_id(snapshot, "snapshot")
    return f"projects/{project}/snapshots/{snapshot}"


def parse(name: object, collection: str, field: str) -> ResourceName:
    """Parse and validate a full resource name; raise InvalidArgument naming `field`."""
    if not isinstance(name, str):
        raise InvalidArgument(field, f"must be a string 'projects/PROJECT/{collection}/ID', got {type(name).__name__}")
    parts = name.split("/")
    if len(parts) != 4 or parts[0] != "projects" or parts[2] != collection:
        raise InvalidArgument(field, f"{name!r} must have the form 'projects/PROJECT/{collection}/ID'")
    _check_project(parts[1], field)
    _check_id(parts[3], field)
    return ResourceName(parts[1], collection, parts[3])


def parse_topic(name: object, field: str = "topic") -> ResourceName:
    return parse(name, "topics", field)


def parse_subscription(name: object, field: str = "subscription") -> ResourceName:
    return parse(name, "subscriptions", field)


def parse_snapshot(name: object, field: str = "snapshot") -> ResourceName:
    return parse(name, "snapshots", field)


def parse_project(project: object, field: str = "project") -> str:
    """Accept 'P' or 'projects/P'."""
    if isinstance(project, str) and project.startswith("projects/"):
        project = project[len("projects/") :]
    if not isinstance(project, str):
        raise InvalidArgument(field, "must be a string")
    _check_project(project, field)
    return project
