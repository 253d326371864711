-- Each table's location in one spelling (storage.files.location_key: `file:/p` for a local path, `s3:/bucket/p`
-- for an object store; no trailing slash), so that a new table whose location equals, contains or lies inside
-- another's is refused: dropping one would delete the other's files. Rows from before are keyed here in SQL, as
-- the Python function would for every location this service hands out or accepts (no `..`, no percent-escapes).
ALTER TABLE tables ADD COLUMN IF NOT EXISTS location_key text;
UPDATE tables SET location_key = rtrim(CASE
        WHEN location LIKE '/%' THEN 'file:' || location
        WHEN location LIKE 'file:%' THEN 'file:/' || ltrim(substr(location, 6), '/')
        ELSE regexp_replace(location, '^([A-Za-z][A-Za-z0-9+.-]*)://', '\1:/')
    END, '/')
    WHERE location IS NOT NULL AND location_key IS NULL;
-- Byte order ("C"): a location's descendants are then one range, [key || '/', key || '0').
CREATE INDEX IF NOT EXISTS tables_location_key ON tables (location_key COLLATE "C");
