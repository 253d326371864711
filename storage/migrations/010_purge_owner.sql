-- Who may renew and end a purge claim: a token the drop writes (NULL in claims from before it did), replaced by
-- a fresh one when a member takes the claim over (Registry.resume_purges). Renewal and end are conditional on it:
-- a member that froze mid-deletion and wakes after another took its claim over can no longer end that claim
-- while the other's deletion still runs (a create could then land at the location and lose its files to it).
ALTER TABLE purges ADD COLUMN IF NOT EXISTS owner uuid;
