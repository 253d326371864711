"""The coordinator's own maintenance of tables beside their writers: Iceberg snapshot expiry and the deletion of
what only expired snapshots referenced (docs/maintenance.md)."""

from .maintainer import Maintainer, Report

__all__ = ["Maintainer", "Report"]
