-- Iceberg scan and commit reports (`POST .../tables/{table}/metrics`): kept for observability, never read on the
-- commit path. Dropping a table leaves its reports (they name the table); purge them by age.
CREATE TABLE IF NOT EXISTS iceberg_metric_reports (
    table_id    uuid        NOT NULL,
    report_type text        NOT NULL,
    report      jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS iceberg_metric_reports_table ON iceberg_metric_reports (table_id, created_at);
