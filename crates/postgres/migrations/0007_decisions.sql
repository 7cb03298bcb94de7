-- Decisions on the calls a parked run waits on (tool approvals and
-- `ask_user` questions), from any process. The first decision on a call
-- is final (the primary key); `applied` is set, fenced by the thread's
-- lease, by the process that hands the last of a run's decisions to its
-- engine, just before it does: a run whose decisions were applied may
-- have run the calls, so it is never carried on elsewhere.
CREATE TABLE IF NOT EXISTS rein_decisions (
    run_id     TEXT        NOT NULL REFERENCES rein_runs (run_id) ON DELETE CASCADE,
    call_id    TEXT        NOT NULL,
    decision   JSONB       NOT NULL,
    decided_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    applied    BOOLEAN     NOT NULL DEFAULT false,
    PRIMARY KEY (run_id, call_id)
);
