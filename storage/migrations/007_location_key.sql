-- Each table's location in one spelling (storage.files.location_key: `file:/p` for a local path, `s3:/bucket/p`
-- for an object store; `..`, repeated slashes, percent-escapes and a file:// host resolved), so that a new table
-- whose location equals, contains or lies inside another's is refused: dropping one would delete the other's files.
-- Rows from before get their key at start-up, from Python (PostgresStore._key_locations): SQL cannot spell a
-- location the way every reader resolves it.
ALTER TABLE tables ADD COLUMN IF NOT EXISTS location_key text;
-- Byte order ("C"): a location's descendants are then one range, [key || '/', key || '0').
CREATE INDEX IF NOT EXISTS tables_location_key ON tables (location_key COLLATE "C");
