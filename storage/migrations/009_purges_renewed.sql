-- A running deletion now renews its claim (Registry.resume_purges takes over only claims nobody renewed), so the
-- claim's time is when it was last renewed. A rename, not an edit of 008: databases that applied 008 keep working.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM information_schema.columns
               WHERE table_schema = current_schema() AND table_name = 'purges' AND column_name = 'created_at') THEN
        ALTER TABLE purges RENAME COLUMN created_at TO renewed_at;
    END IF;
END $$;
