-- A dropped table's location stays claimed until its files are deleted. The deletion (a purge, or a Lance or
-- managed Delta drop) runs after the drop is durable; a table created at that location meanwhile would lose its
-- new files to it. The claim is inserted in the drop's transaction and removed when the deletion has run; claims
-- a crash left behind are resumed at start-up (Registry.resume_purges).
CREATE TABLE IF NOT EXISTS purges (
    location_key text PRIMARY KEY,
    location     text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS purges_location_key_c ON purges (location_key COLLATE "C");
