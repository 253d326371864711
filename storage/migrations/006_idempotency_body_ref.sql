-- An Idempotency-Key's answer can be rebuilt from an immutable file instead of stored: a table's commit answers
-- with its whole metadata (megabytes at 10,000 snapshots), and that file is already written. `body_ref` names it.
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS body_ref text;
