-- Named warehouses: a storage root and that storage's settings (endpoint, region, credentials source). The
-- service's own configured root is the warehouse named `default` and is not stored here.
CREATE TABLE IF NOT EXISTS warehouses (
    name text PRIMARY KEY,
    location text NOT NULL UNIQUE,
    storage jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now()
);
