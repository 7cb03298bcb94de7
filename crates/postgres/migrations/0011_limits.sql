-- Provider limits shared by every process (service.md §10): the
-- reservations in each provider's window, the inferences waiting for room,
-- the pauses a 429 asked for, and which processes are alive to hold them.

-- A process holding reservations or waiting, alive until `alive_until`
-- (renewed by its heartbeat and by each reservation).
CREATE TABLE IF NOT EXISTS rein_limit_owners (
    owner TEXT PRIMARY KEY,
    alive_until TIMESTAMPTZ NOT NULL
);

-- One reserved request. In flight while `counts_until` is NULL; settled,
-- it counts until one window after its answer ended. An in-flight row of a
-- process that died counts until one window after its owner's lease.
CREATE TABLE IF NOT EXISTS rein_limit_reservations (
    id BIGSERIAL PRIMARY KEY,
    provider TEXT NOT NULL,
    owner TEXT NOT NULL,
    tokens BIGINT NOT NULL,
    window_ms BIGINT NOT NULL,
    reserved_at TIMESTAMPTZ NOT NULL,
    counts_until TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS rein_limit_reservations_provider
    ON rein_limit_reservations (provider, counts_until);

-- An inference waiting for room, since when (the database's clock).
CREATE TABLE IF NOT EXISTS rein_limit_waiters (
    provider TEXT NOT NULL,
    owner TEXT NOT NULL,
    waiter BIGINT NOT NULL,
    since TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (provider, owner, waiter)
);

-- A provider paused by a 429 until `until`.
CREATE TABLE IF NOT EXISTS rein_limit_pauses (
    provider TEXT PRIMARY KEY,
    until TIMESTAMPTZ NOT NULL
);

-- A provider's reservations at `now_ts`: each one's tokens and when it
-- stops counting (NULL: in flight, its owner alive).
CREATE OR REPLACE FUNCTION rein_limit_window(p_provider TEXT, now_ts TIMESTAMPTZ)
RETURNS TABLE (tokens BIGINT, until TIMESTAMPTZ) LANGUAGE sql STABLE AS $$
    SELECT r.tokens,
           CASE WHEN r.counts_until IS NOT NULL THEN r.counts_until
                WHEN o.alive_until IS NULL OR o.alive_until <= now_ts
                    THEN COALESCE(o.alive_until, now_ts)
                         + make_interval(secs => r.window_ms / 1000.0)
           END
    FROM rein_limit_reservations r LEFT JOIN rein_limit_owners o ON o.owner = r.owner
    WHERE r.provider = p_provider
$$;

-- Reserves one request and `p_tokens` on a provider for `p_owner`, in one
-- round trip, under a per-provider advisory lock: `id` is the reservation,
-- or NULL with `wait_ms` (NULL: ask again when something settles). When
-- there is room, a process goes only if no other live process has waited
-- longer (its oldest waiter is the oldest); an inference that has not
-- queued, only if no other process's waiter waits.
CREATE OR REPLACE FUNCTION rein_limit_reserve(
    p_provider TEXT, p_owner TEXT, p_lease_ms BIGINT, p_tokens BIGINT,
    p_requests_cap BIGINT, p_tokens_cap BIGINT, p_concurrent_cap BIGINT,
    p_window_ms BIGINT, p_waiter BIGINT
) RETURNS TABLE (id BIGINT, wait_ms BIGINT) LANGUAGE plpgsql AS $$
DECLARE
    now_ts TIMESTAMPTZ := clock_timestamp();
    win INTERVAL := make_interval(secs => p_window_ms / 1000.0);
    my_since TIMESTAMPTZ;
    paused TIMESTAMPTZ;
    n_requests BIGINT;
    n_tokens BIGINT;
    n_flight BIGINT;
    at_req TIMESTAMPTZ;
    at_tok TIMESTAMPTZ;
    blocked BOOLEAN := FALSE;
    new_id BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('rein_limits'), hashtext(p_provider));
    INSERT INTO rein_limit_owners AS o (owner, alive_until)
        VALUES (p_owner, now_ts + make_interval(secs => p_lease_ms / 1000.0))
        ON CONFLICT (owner) DO UPDATE
        SET alive_until = GREATEST(o.alive_until, EXCLUDED.alive_until);
    DELETE FROM rein_limit_reservations r
        WHERE r.provider = p_provider AND r.counts_until <= now_ts;
    DELETE FROM rein_limit_reservations r USING rein_limit_owners o
        WHERE r.provider = p_provider AND r.counts_until IS NULL
          AND o.owner = r.owner
          AND o.alive_until + make_interval(secs => r.window_ms / 1000.0) <= now_ts;

    SELECT p.until INTO paused FROM rein_limit_pauses p WHERE p.provider = p_provider;
    IF paused > now_ts THEN
        RETURN QUERY SELECT NULL::BIGINT,
            ceil(extract(epoch FROM paused - now_ts) * 1000)::BIGINT;
        RETURN;
    END IF;

    SELECT count(*), COALESCE(sum(w.tokens), 0), count(*) FILTER (WHERE w.until IS NULL)
        INTO n_requests, n_tokens, n_flight FROM rein_limit_window(p_provider, now_ts) w;

    IF p_concurrent_cap IS NOT NULL AND n_flight >= p_concurrent_cap THEN
        blocked := TRUE;
    END IF;
    IF NOT blocked AND p_requests_cap IS NOT NULL AND n_requests >= p_requests_cap THEN
        SELECT w.until INTO at_req FROM rein_limit_window(p_provider, now_ts) w WHERE w.until IS NOT NULL
            ORDER BY w.until OFFSET (n_requests - p_requests_cap) LIMIT 1;
        blocked := TRUE;
        IF at_req IS NULL THEN at_req := 'infinity'; END IF;
    END IF;
    IF NOT blocked AND p_tokens_cap IS NOT NULL AND n_tokens + p_tokens > p_tokens_cap THEN
        SELECT c.until INTO at_tok FROM (
            SELECT w.until, sum(w.tokens) OVER (ORDER BY w.until) AS freed
            FROM rein_limit_window(p_provider, now_ts) w WHERE w.until IS NOT NULL
        ) c WHERE c.freed >= n_tokens + p_tokens - p_tokens_cap ORDER BY c.until LIMIT 1;
        blocked := TRUE;
        IF at_tok IS NULL THEN at_tok := 'infinity'; END IF;
    END IF;
    IF blocked THEN
        at_req := GREATEST(at_req, at_tok);
        RETURN QUERY SELECT NULL::BIGINT,
            CASE WHEN at_req IS NULL OR at_req = 'infinity' THEN NULL
                 ELSE GREATEST(0, ceil(extract(epoch FROM at_req - now_ts) * 1000))::BIGINT END;
        RETURN;
    END IF;

    -- A process goes in the order of its oldest waiter (its queue admits
    -- its own waiters in order): comparing single waiters across processes
    -- could leave each process's head behind the other's younger waiter.
    SELECT min(w.since) INTO my_since FROM rein_limit_waiters w
        JOIN rein_limit_owners o ON o.owner = w.owner
        WHERE w.provider = p_provider AND w.owner = p_owner;
    IF EXISTS (
        SELECT 1 FROM rein_limit_waiters w JOIN rein_limit_owners o ON o.owner = w.owner
        WHERE w.provider = p_provider AND o.alive_until > now_ts
          AND w.owner <> p_owner
          AND w.since < COALESCE(my_since, now_ts)
    ) THEN
        -- Room, but an older waiter of another process goes first: it is
        -- awake (it asks when room frees), so ask again in a moment.
        RETURN QUERY SELECT NULL::BIGINT, 2::BIGINT;
        RETURN;
    END IF;

    INSERT INTO rein_limit_reservations (provider, owner, tokens, window_ms, reserved_at)
        VALUES (p_provider, p_owner, p_tokens, p_window_ms, now_ts)
        RETURNING rein_limit_reservations.id INTO new_id;
    DELETE FROM rein_limit_waiters w
        WHERE w.provider = p_provider AND w.owner = p_owner AND w.waiter = p_waiter;
    RETURN QUERY SELECT new_id, NULL::BIGINT;
END
$$;
