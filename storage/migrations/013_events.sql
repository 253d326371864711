-- The commit feed's outbox: one row per event, inserted by the group-commit writer in the same transaction as the
-- commit it reports (storage/writer.py), so none is lost and none exists for a commit that did not apply.
-- `xid` is the writing transaction's id and `seq` the event's place within it (from 1): the feed is read in
-- (xid, seq) order, and only below the reading snapshot's xmin, where no transaction can still add a row
-- (storage/events.py). `time` is the transaction's start. `catalog` is the table's catalog (Iceberg prefix, Unity
-- Catalog catalog; '' for none), which a reader's grants are checked against.
CREATE TABLE IF NOT EXISTS events (
    xid       xid8        NOT NULL DEFAULT pg_current_xact_id(),
    seq       int         NOT NULL,
    id        uuid        NOT NULL,
    table_id  uuid        NOT NULL,
    type      text        NOT NULL,
    subject   text        NOT NULL,
    catalog   text        NOT NULL,
    data      jsonb       NOT NULL,
    time      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (xid, seq)
);

-- Retention (storage/events.py prune): every event at or below this position was deleted. A reader resuming
-- below it has missed events (410).
CREATE TABLE IF NOT EXISTS events_floor (
    one  boolean PRIMARY KEY DEFAULT true CHECK (one),
    xid  xid8    NOT NULL,
    seq  int     NOT NULL
);
INSERT INTO events_floor (xid, seq) VALUES ('0', 0) ON CONFLICT DO NOTHING;
