-- The commit feed applies a reader's grants in its query (storage/events.py): each event carries the securable a
-- reader must be allowed to read to see it (coordinator/events.py `securable_key`): its names, outermost first
-- (the format, the catalog where grants name one, the namespace levels, the table), each with `%` and `/` escaped
-- (`%25`, `%2F`), joined by `/`. A grant on a table is that key; a grant on a container covers the keys that start
-- with the container's key and a `/`. Compared byte by byte (COLLATE "C"), so a container's tables are one range
-- of the index, read in feed order per table.
ALTER TABLE events ADD COLUMN IF NOT EXISTS securable text COLLATE "C";

-- Events written before this migration: the same key from their type, catalog and name. Iceberg's catalog (its
-- prefix) is a segment even when it is "" (the default catalog), and its name holds it only when it is not "".
UPDATE events e SET securable = split_part(e.type, '.', 1) || '/' || (
    SELECT string_agg(replace(replace(p.part, '%', '%25'), '/', '%2F'), '/' ORDER BY p.n)
    FROM (SELECT e.catalog AS part, 0 AS n WHERE split_part(e.type, '.', 1) = 'iceberg'
          UNION ALL
          SELECT t.part, t.n FROM jsonb_array_elements_text(e.data -> 'name') WITH ORDINALITY AS t(part, n)
          WHERE NOT (split_part(e.type, '.', 1) = 'iceberg' AND e.catalog <> '' AND t.n = 1)) p)
WHERE e.securable IS NULL;

ALTER TABLE events ALTER COLUMN securable SET NOT NULL;
CREATE INDEX IF NOT EXISTS events_securable ON events (securable, xid, seq);
