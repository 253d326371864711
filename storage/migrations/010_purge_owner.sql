-- Who may renew and end a purge claim. NULL: the member that served the drop. A member that takes a claim over
-- (Registry.resume_purges) writes a fresh token, and renews and ends the claim only under it: a member that froze
-- mid-deletion and wakes after another took its claim over can no longer end that claim while the other's
-- deletion still runs (a create could then land at the location and lose its files to it).
ALTER TABLE purges ADD COLUMN IF NOT EXISTS owner uuid;
