"""Iceberg's pure rules: state and request in, new metadata (or a spec-named typed error) out. No I/O.

- `requirements.py`: a commit's requirements (TableRequirement), checked against the metadata;
- `updates.py`, `schema_updates.py`, `builder.py`: what each TableUpdate does to the metadata;
- `metadata.py`: new-table metadata and a whole commit (requirements, then updates, then the checks of a build);
- `views.py`: the same for views;
- `catalog.py`: the catalog's own rules: valid names and namespaces, where a table may be moved, name clashes.
"""

from .metadata import apply_commit, new_table_metadata
from .requirements import check_requirements, parse_requirements
from .updates import parse_updates
from .views import apply_view_commit, check_view_requirements, new_view_metadata, parse_view_requirements, \
    parse_view_updates

__all__ = ["apply_commit", "apply_view_commit", "check_requirements", "check_view_requirements",
           "new_table_metadata", "new_view_metadata", "parse_requirements", "parse_updates",
           "parse_view_requirements", "parse_view_updates"]
