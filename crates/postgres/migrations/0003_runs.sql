-- Runs (the inbox and the run records) and their events.
--
-- A submission is a `queued` row, written before its 202; the thread's
-- owner claims rows in order (`running`), and finishes them with their
-- record. `seq` orders a thread's submissions; `interrupt` rows are
-- claimed before `enqueue` rows (they jump the queue, as in-process).
-- The unique index on (thread_id, idempotency_key) makes a repeated key
-- find the first submission's run, whichever process it reached.
CREATE TABLE IF NOT EXISTS rein_runs (
    run_id           TEXT PRIMARY KEY,
    thread_id        TEXT        NOT NULL,
    agent_id         TEXT        NOT NULL,
    seq              BIGSERIAL   NOT NULL,
    interrupt        BOOLEAN     NOT NULL,
    idempotency_key  TEXT,
    messages         JSONB       NOT NULL,
    status           TEXT        NOT NULL DEFAULT 'queued'
                     CHECK (status IN ('queued', 'running', 'finished')),
    cancel_requested BOOLEAN     NOT NULL DEFAULT false,
    record           JSONB,
    worker           TEXT,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at       TIMESTAMPTZ,
    finished_at      TIMESTAMPTZ
);

CREATE UNIQUE INDEX IF NOT EXISTS rein_runs_idempotency
    ON rein_runs (thread_id, idempotency_key);

-- What is still to do, per thread, in order.
CREATE INDEX IF NOT EXISTS rein_runs_open
    ON rein_runs (thread_id, seq) WHERE status <> 'finished';

CREATE INDEX IF NOT EXISTS rein_runs_finished_at
    ON rein_runs (finished_at) WHERE status = 'finished';

-- A run's events, numbered from 1 per run (the SSE ids); `data` is the
-- event's JSON text exactly as emitted.
CREATE TABLE IF NOT EXISTS rein_events (
    run_id TEXT   NOT NULL REFERENCES rein_runs (run_id) ON DELETE CASCADE,
    seq    BIGINT NOT NULL,
    kind   TEXT   NOT NULL,
    data   TEXT   NOT NULL,
    PRIMARY KEY (run_id, seq)
);
