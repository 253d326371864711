-- Files of a live table that the service deletes because only expired snapshots referenced them (snapshot
-- expiry, coordinator/maintenance). A claim is recorded before the expiry commit that makes the files
-- unreferenced: it names the expired snapshots' manifest lists, from which the deletion finds the manifests, data
-- and delete files, each checked against the table's snapshots at that moment. Renewed while a deletion runs and
-- taken over when nobody renewed it (a crash), as the `purges` claims on dropped tables' locations are.
CREATE TABLE IF NOT EXISTS file_deletions (
    claim_id       uuid PRIMARY KEY,
    table_id       uuid NOT NULL,
    location       text NOT NULL,
    manifest_lists jsonb NOT NULL,
    owner          uuid NOT NULL,
    renewed_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS file_deletions_renewed ON file_deletions (renewed_at);
