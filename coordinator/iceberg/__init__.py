"""Iceberg REST commit rules: parse a commit's requirements and updates, check and apply them to metadata.

Pure functions over JSON-shaped metadata dicts; no I/O (`rules/`). This is the surface the HTTP layer and the
table actor use for them (tests/iceberg checks the list). The package's other modules, by role: `models.py` and
`changes.py` (the spec's models), `state.py` (a table's in-memory state), `proposals.py` (what the table's actor
decides), `service.py` (`IcebergService`, what `api/iceberg/` calls), `files.py` (what Iceberg reads and writes
in table locations).
"""

from coordinator.iceberg.changes import Requirement, Update
from coordinator.iceberg.rules import apply_commit, check_requirements, new_table_metadata, parse_requirements, \
    parse_updates

__all__ = [
    "Requirement",
    "Update",
    "apply_commit",
    "check_requirements",
    "new_table_metadata",
    "parse_requirements",
    "parse_updates",
]
