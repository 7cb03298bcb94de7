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

-- Each provider's totals over its rows in `rein_limit_reservations`: every
-- change to those rows changes these in the same transaction, so an
-- admission reads three numbers instead of scanning its window.
CREATE TABLE IF NOT EXISTS rein_limit_books (
    provider TEXT PRIMARY KEY,
    requests BIGINT NOT NULL DEFAULT 0,
    tokens BIGINT NOT NULL DEFAULT 0,
    -- Unsettled rows (of dead processes too, until they are removed).
    in_flight BIGINT NOT NULL DEFAULT 0
);

-- A provider paused by a 429 until `until`.
CREATE TABLE IF NOT EXISTS rein_limit_pauses (
    provider TEXT PRIMARY KEY,
    until TIMESTAMPTZ NOT NULL
);

-- Reserves one request and `p_tokens` on a provider for `p_owner`, in one
-- round trip, under a per-provider advisory lock: `id` is the reservation,
-- or NULL with `wait_ms` (NULL: ask again when something settles). When
-- there is room, a process goes only if no other live process has waited
-- longer (its oldest waiter is the oldest); an inference that has not
-- queued, only if no other process's waiter waits. The window's totals
-- come from `rein_limit_books`; rows are only read one by one to find
-- when room frees up, in expiry order, as far as needed.
CREATE OR REPLACE FUNCTION rein_limit_reserve(
    p_provider TEXT, p_owner TEXT, p_lease_ms BIGINT, p_tokens BIGINT,
    p_requests_cap BIGINT, p_tokens_cap BIGINT, p_concurrent_cap BIGINT,
    p_window_ms BIGINT, p_waiter BIGINT
) RETURNS TABLE (id BIGINT, wait_ms BIGINT) LANGUAGE plpgsql AS $$
DECLARE
    now_ts TIMESTAMPTZ := clock_timestamp();
    my_since TIMESTAMPTZ;
    paused TIMESTAMPTZ;
    gone_requests BIGINT;
    gone_tokens BIGINT;
    lost_requests BIGINT;
    lost_tokens BIGINT;
    n_requests BIGINT;
    n_tokens BIGINT;
    n_flight BIGINT;
    -- When room frees up, if known.
    at_room TIMESTAMPTZ;
    need BIGINT;
    row_ RECORD;
    -- Whether the answer is to wait (`wait_out`: how long; NULL: until
    -- something settles).
    decided BOOLEAN := FALSE;
    wait_out BIGINT;
    new_id BIGINT;
BEGIN
    -- A reservation lost with a database crash costs at most one
    -- over-admission: not worth waiting for the WAL at commit.
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_advisory_xact_lock(hashtext('rein_limits'), hashtext(p_provider));
    -- A sign of life, written only when half the lease has gone by (the
    -- heartbeat renews it too).
    INSERT INTO rein_limit_owners AS o (owner, alive_until)
        VALUES (p_owner, now_ts + make_interval(secs => p_lease_ms / 1000.0))
        ON CONFLICT (owner) DO UPDATE
        SET alive_until = EXCLUDED.alive_until
        WHERE o.alive_until < now_ts + make_interval(secs => p_lease_ms / 2000.0);
    INSERT INTO rein_limit_books (provider) VALUES (p_provider) ON CONFLICT DO NOTHING;

    -- Out of the window: settled rows past their time, and rows of
    -- processes dead for a window.
    WITH gone AS (
        DELETE FROM rein_limit_reservations r
        WHERE r.provider = p_provider AND r.counts_until <= now_ts
        RETURNING r.tokens
    ) SELECT count(*), COALESCE(sum(g.tokens), 0) INTO gone_requests, gone_tokens FROM gone g;
    WITH lost AS (
        DELETE FROM rein_limit_reservations r USING rein_limit_owners o
        WHERE r.provider = p_provider AND r.counts_until IS NULL
          AND o.owner = r.owner
          AND o.alive_until + make_interval(secs => r.window_ms / 1000.0) <= now_ts
        RETURNING r.tokens
    ) SELECT count(*), COALESCE(sum(l.tokens), 0) INTO lost_requests, lost_tokens FROM lost l;
    -- The totals, less what just left; written back once, at the end.
    SELECT b.requests - gone_requests - lost_requests, b.tokens - gone_tokens - lost_tokens,
           b.in_flight - lost_requests
        INTO n_requests, n_tokens, n_flight
        FROM rein_limit_books b WHERE b.provider = p_provider;

    SELECT p.until INTO paused FROM rein_limit_pauses p WHERE p.provider = p_provider;
    IF paused > now_ts THEN
        wait_out := ceil(extract(epoch FROM paused - now_ts) * 1000)::BIGINT;
        decided := TRUE;
    END IF;

    IF NOT decided AND p_concurrent_cap IS NOT NULL AND n_flight >= p_concurrent_cap THEN
        -- The books count dead processes' calls too: count the live ones.
        SELECT count(*) INTO n_flight
            FROM rein_limit_reservations r JOIN rein_limit_owners o ON o.owner = r.owner
            WHERE r.provider = p_provider AND r.counts_until IS NULL
              AND o.alive_until > now_ts;
        -- Full: only a settle makes room (wait_ms NULL).
        decided := n_flight >= p_concurrent_cap;
    END IF;
    IF NOT decided AND p_requests_cap IS NOT NULL AND n_requests >= p_requests_cap THEN
        -- The settled row whose expiry brings the count below the cap.
        SELECT r.counts_until INTO at_room FROM rein_limit_reservations r
            WHERE r.provider = p_provider AND r.counts_until IS NOT NULL
            ORDER BY r.counts_until OFFSET (n_requests - p_requests_cap) LIMIT 1;
        decided := TRUE;
    END IF;
    IF NOT decided AND p_tokens_cap IS NOT NULL AND n_tokens + p_tokens > p_tokens_cap THEN
        -- The settled row whose expiry frees enough tokens.
        need := n_tokens + p_tokens - p_tokens_cap;
        FOR row_ IN SELECT r.tokens, r.counts_until FROM rein_limit_reservations r
            WHERE r.provider = p_provider AND r.counts_until IS NOT NULL
            ORDER BY r.counts_until
        LOOP
            need := need - row_.tokens;
            IF need <= 0 THEN
                at_room := row_.counts_until;
                EXIT;
            END IF;
        END LOOP;
        decided := TRUE;
    END IF;
    IF at_room IS NOT NULL THEN
        wait_out := GREATEST(0, ceil(extract(epoch FROM at_room - now_ts) * 1000))::BIGINT;
    END IF;

    IF NOT decided THEN
        -- A process goes in the order of its oldest waiter (its queue
        -- admits its own waiters in order): comparing single waiters
        -- across processes could leave each process's head behind the
        -- other's younger waiter.
        SELECT min(w.since) INTO my_since FROM rein_limit_waiters w
            WHERE w.provider = p_provider AND w.owner = p_owner;
        IF EXISTS (
            SELECT 1 FROM rein_limit_waiters w JOIN rein_limit_owners o ON o.owner = w.owner
            WHERE w.provider = p_provider AND o.alive_until > now_ts
              AND w.owner <> p_owner
              AND w.since < COALESCE(my_since, now_ts)
        ) THEN
            -- Room, but an older waiter of another process goes first: it
            -- is awake (it asks when room frees), so ask again in a moment.
            wait_out := 2;
            decided := TRUE;
        END IF;
    END IF;

    IF NOT decided THEN
        INSERT INTO rein_limit_reservations (provider, owner, tokens, window_ms, reserved_at)
            VALUES (p_provider, p_owner, p_tokens, p_window_ms, now_ts)
            RETURNING rein_limit_reservations.id INTO new_id;
        DELETE FROM rein_limit_waiters w
            WHERE w.provider = p_provider AND w.owner = p_owner AND w.waiter = p_waiter;
    END IF;
    -- The totals: what left the window, and the new reservation.
    IF new_id IS NOT NULL OR gone_requests + lost_requests > 0 THEN
        UPDATE rein_limit_books b
            SET requests = b.requests - gone_requests - lost_requests
                           + CASE WHEN new_id IS NULL THEN 0 ELSE 1 END,
                tokens = b.tokens - gone_tokens - lost_tokens
                         + CASE WHEN new_id IS NULL THEN 0 ELSE p_tokens END,
                in_flight = b.in_flight - lost_requests
                            + CASE WHEN new_id IS NULL THEN 0 ELSE 1 END
            WHERE b.provider = p_provider;
    END IF;
    RETURN QUERY SELECT new_id, CASE WHEN new_id IS NULL THEN wait_out END;
END
$$;

-- Settles reservation `p_id` with the tokens its answer used: it counts
-- until one window after `p_received_ago_ms` before now (when the provider
-- answered). A reservation already removed (its process was taken for
-- dead) is left alone.
CREATE OR REPLACE FUNCTION rein_limit_settle(p_id BIGINT, p_tokens BIGINT, p_received_ago_ms BIGINT)
RETURNS VOID LANGUAGE plpgsql AS $$
DECLARE
    old_tokens BIGINT;
    was_in_flight BOOLEAN;
    p_provider TEXT;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT r.tokens, r.counts_until IS NULL, r.provider INTO old_tokens, was_in_flight, p_provider
        FROM rein_limit_reservations r WHERE r.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE rein_limit_reservations r
    SET tokens = p_tokens,
        counts_until = GREATEST(r.reserved_at,
                                clock_timestamp() - p_received_ago_ms * interval '1 millisecond')
                       + r.window_ms * interval '1 millisecond'
    WHERE r.id = p_id;
    UPDATE rein_limit_books b
        SET tokens = b.tokens + p_tokens - old_tokens,
            in_flight = b.in_flight - CASE WHEN was_in_flight THEN 1 ELSE 0 END
        WHERE b.provider = p_provider;
END
$$;
