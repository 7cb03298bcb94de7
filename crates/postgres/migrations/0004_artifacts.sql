-- Offloaded tool results (the context policy's artifacts): the full text
-- of a result the model sees as a reference, read back with
-- `read_artifact` by whichever process runs the thread next.
--
-- The text is kept as bytes: a tool's output may hold NUL characters,
-- which a TEXT column refuses.
CREATE TABLE IF NOT EXISTS rein_artifacts (
    thread_id   TEXT        NOT NULL,
    artifact_id TEXT        NOT NULL,
    body        BYTEA       NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, artifact_id)
);
