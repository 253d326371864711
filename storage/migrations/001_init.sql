-- Namespaces of every protocol. `realm` separates the protocols' universes (iceberg, lance, uc); `catalog` is the
-- Iceberg prefix / warehouse or the Unity Catalog catalog name; `path` the namespace levels joined by U+001F.
CREATE TABLE namespaces (
    realm       text        NOT NULL,
    catalog     text        NOT NULL,
    path        text        NOT NULL,
    properties  jsonb       NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (realm, catalog, path)
);

-- One row per table or view. `row_version` is the compare-and-set counter every write bumps; `epoch` is the
-- owner's fencing token (scale-out); `state` is the format's small current-state pointer (e.g. the Iceberg
-- metadata location), never the whole metadata.
CREATE TABLE tables (
    table_id    uuid        PRIMARY KEY,
    realm       text        NOT NULL,
    catalog     text        NOT NULL,
    namespace   text        NOT NULL,
    name        text        NOT NULL,
    kind        text        NOT NULL DEFAULT 'table',
    format      text        NOT NULL,
    location    text,
    row_version bigint      NOT NULL DEFAULT 0,
    epoch       bigint      NOT NULL DEFAULT 0,
    state       jsonb       NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (realm, catalog, namespace, name)
);

-- Per-table commit log, keyed by the format's own version number: two versions with one number are impossible
-- even if an actor has a bug.
CREATE TABLE commits (
    table_id    uuid        NOT NULL,
    version     bigint      NOT NULL,
    payload     jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_id, version)
);

-- Idempotency-Key replay records, written in the same transaction as the change they record.
CREATE TABLE idempotency_keys (
    key         uuid        PRIMARY KEY,
    route       text        NOT NULL,
    status      int         NOT NULL,
    body        bytea,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idempotency_keys_created_at ON idempotency_keys (created_at);
