-- What a purge claim deletes. NULL: everything under the location (a location the table was given by the
-- service and never left, so nothing else can be there). Else the Iceberg metadata file whose reachable files
-- (data and delete files, manifests, manifest lists, statistics, metadata files) are deleted, as Java's
-- CatalogUtil.dropTableData does: a location the client chose may also hold files of tables that moved away or
-- were dropped without purge, and those must survive.
ALTER TABLE purges ADD COLUMN IF NOT EXISTS metadata_location text;
