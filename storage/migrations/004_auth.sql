-- The key that signs bearer tokens when the auth file names none: made by the first member to start and shared by
-- all, so a token issued by one process is accepted by every other.
CREATE TABLE auth_signing_keys (
    name        text        PRIMARY KEY,
    secret      bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
