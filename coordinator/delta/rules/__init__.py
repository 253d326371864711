"""Rules for catalog-managed Delta tables: pure functions of a table's state and a request, one per rule of the
spec, each returning a new state (or what to answer) or raising the spec's typed error.

Sources: the seed (UC Managed Tables spec 0.1.0, "Write a Commit" / "Get Commits" / "Create a Table") and the
Delta RFC `catalog-managed.md` ("Commit Protocol": a catalog must not ratify `v` before `v - 1` and ratifies
each version at most once; "Publishing Commits": commits are published in order). Nothing here does I/O or
reads a clock, so the table actor can decide a whole batch against in-memory state and re-decide after a reload.

- `tables.py`: names and locations, which table a request reaches, a managed table's required properties and
  first commit, metrics reports and credential requests;
- `commits.py`: a commit's checks and ratification, backpressure, metadata changes, UniForm, publishing, and the
  commits a reader is given.
"""

from .commits import (apply_metadata, check_backpressure, check_commit_info, check_commit_request, check_uniform,
                      commits_page, decide_commit, is_replay, ratified, ratify, record_conversion, record_published)
from .tables import (FIRST_COMMIT_FILE, FullName, ICT_PROPERTY, MIN_VERSION_PROPERTIES, REQUIRED_FEATURE_PROPERTIES,
                     REQUIRED_READER_FEATURES, REQUIRED_WRITER_FEATURES, STAMP_PROPERTIES, TABLE_ID_PROPERTY,
                     check_first_commit, check_metrics, check_name, check_required_properties, check_table_uri,
                     is_within, normalize_uri, require_managed, require_table, split_full_name, table_named,
                     temporary_credentials, unused_staging)

__all__ = ["FIRST_COMMIT_FILE", "FullName", "ICT_PROPERTY", "MIN_VERSION_PROPERTIES", "REQUIRED_FEATURE_PROPERTIES",
           "REQUIRED_READER_FEATURES", "REQUIRED_WRITER_FEATURES", "STAMP_PROPERTIES", "TABLE_ID_PROPERTY",
           "apply_metadata", "check_backpressure", "check_commit_info", "check_commit_request", "check_first_commit",
           "check_metrics", "check_name", "check_required_properties", "check_table_uri", "check_uniform",
           "commits_page", "decide_commit", "is_replay", "is_within", "normalize_uri", "ratified", "ratify",
           "record_conversion", "record_published", "require_managed", "require_table", "split_full_name",
           "table_named", "temporary_credentials", "unused_staging"]
