"""Iceberg REST commit rules: parse a commit's requirements and updates, check and apply them to metadata.

Pure functions over JSON-shaped metadata dicts; no I/O. The implementation modules are private in spirit;
this is the surface the HTTP layer and the table actor use (tests/iceberg checks the list).
"""

from coordinator.iceberg.metadata import apply_commit, new_table_metadata
from coordinator.iceberg.models import Requirement, Update
from coordinator.iceberg.requirements import check_requirements, parse_requirements
from coordinator.iceberg.updates import parse_updates

__all__ = [
    "Requirement",
    "Update",
    "apply_commit",
    "check_requirements",
    "new_table_metadata",
    "parse_requirements",
    "parse_updates",
]
