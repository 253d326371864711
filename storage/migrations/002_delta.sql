-- Delta commit metrics (`POST /delta/metrics`), kept for maintenance scheduling. Not part of any commit: a
-- report is validated against the table's actor, then appended here; dropping the table deletes its reports.
CREATE TABLE IF NOT EXISTS delta_commit_metrics (
    table_id        uuid        NOT NULL,
    commit_version  bigint      NOT NULL,
    report          jsonb       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS delta_commit_metrics_table ON delta_commit_metrics (table_id, commit_version);
