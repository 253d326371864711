-- Scale-out: several coordinator processes on one database. Tables map to SHARDS fixed shards (coordinator/
-- cluster/leases.py); each shard is owned by one member at a time under a lease. `epoch` is the fencing token:
-- it grows on every takeover, and every write of a table row checks it (storage/postgres.py), so a former owner
-- that has not noticed its lease moved can change nothing. `expires_at` is compared with the database's now()
-- only: members never compare their own clocks.
CREATE TABLE IF NOT EXISTS shard_leases (
    shard       int         PRIMARY KEY,
    owner       uuid,
    epoch       bigint      NOT NULL DEFAULT 0,
    expires_at  timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO shard_leases (shard) SELECT generate_series(0, 63) ON CONFLICT DO NOTHING;

-- Members announce themselves here: the address of their internal channel (coordinator/cluster/channel.py) and a
-- heartbeat, renewed with their leases. No other coordination service.
CREATE TABLE IF NOT EXISTS cluster_members (
    member_id    uuid        PRIMARY KEY,
    address      text        NOT NULL,
    pid          int,
    hostname     text,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

-- The epoch under which each commit-log row was written: lets an operator (and the fencing tests) check at the
-- database level that no former owner wrote after its lease moved.
ALTER TABLE commits ADD COLUMN IF NOT EXISTS epoch bigint;
