-- Cancel requests from any process: a counter per thread, bumped by each
-- request; the thread's owner cancels its run when it sees it grow
-- (notified on channel `rein_cancel`, and by polling as the safety net).
ALTER TABLE rein_threads ADD COLUMN IF NOT EXISTS cancel_seq BIGINT NOT NULL DEFAULT 0;
