-- Metrics reports (Iceberg's scan and commit reports, Delta's commit metrics) are bounded: each table keeps its
-- newest `metrics_reports_per_table`, and a report is deleted `metrics_report_retain_s` after it came. `seq` is
-- the order the reports came in, which "newest" means; `created_at` alone is what the expiry scans.
ALTER TABLE iceberg_metric_reports ADD COLUMN IF NOT EXISTS seq bigint GENERATED ALWAYS AS IDENTITY;
ALTER TABLE delta_commit_metrics ADD COLUMN IF NOT EXISTS seq bigint GENERATED ALWAYS AS IDENTITY;
CREATE INDEX IF NOT EXISTS iceberg_metric_reports_seq ON iceberg_metric_reports (table_id, seq);
CREATE INDEX IF NOT EXISTS delta_commit_metrics_seq ON delta_commit_metrics (table_id, seq);
CREATE INDEX IF NOT EXISTS iceberg_metric_reports_age ON iceberg_metric_reports (created_at);
CREATE INDEX IF NOT EXISTS delta_commit_metrics_age ON delta_commit_metrics (created_at);
