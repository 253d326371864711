-- A dropped table's location stays claimed until its files are deleted. The deletion (a purge, or a Lance or
-- managed Delta drop) runs after the drop is durable; a table created at that location meanwhile would lose its
-- new files to it. The claim is inserted in the drop's transaction, renewed while the deletion runs and removed
-- when it has ended; claims a crash or a failed deletion left behind are resumed (Registry.resume_purges).
CREATE TABLE IF NOT EXISTS purges (
    location_key text PRIMARY KEY,
    location     text NOT NULL,
    renewed_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS purges_location_key_c ON purges (location_key COLLATE "C");
