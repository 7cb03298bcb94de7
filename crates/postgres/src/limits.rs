//! [`PgLimitLedger`]: provider limits as one budget for the whole cluster.
//!
//! Every process reserves in the same tables, one provider at a time under
//! an advisory lock, in one round trip (`rein_limit_reserve`, migration
//! `0011`). Waiters are recorded with the database's clock, and the oldest
//! waiter of a live process goes first, so the order is global. A process
//! that dies holding reservations stops counting as in flight when its
//! lease ends (its heartbeat, [`Database::renew`](crate::Database::renew),
//! keeps it alive), and its reservations leave the window one window later.

use std::time::Duration;

use rein_runtime::limits::{
    Ask, LedgerError, LedgerUsage, LimitLedger, ProviderLimits, Reserve, Waiter,
};
use sqlx::postgres::PgPool;

/// Provider limits kept in PostgreSQL, shared by every process.
#[derive(Debug, Clone)]
pub struct PgLimitLedger {
    pool: PgPool,
    owner: String,
    lease: Duration,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn cap(value: Option<u64>) -> Option<i64> {
    value.map(|v| i64::try_from(v).unwrap_or(i64::MAX))
}

fn failed(error: &sqlx::Error) -> LedgerError {
    LedgerError(error.to_string())
}

impl PgLimitLedger {
    /// The ledger of the process `owner`, alive for `lease` after each
    /// reservation or [`heartbeat`](Self::heartbeat).
    pub fn new(pool: PgPool, owner: impl Into<String>, lease: Duration) -> Self {
        Self {
            pool,
            owner: owner.into(),
            lease,
        }
    }

    /// Keeps this process's reservations and waiters counted for another
    /// lease.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped midway, the lease is renewed or not.
    pub async fn heartbeat(&self) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE rein_limit_owners SET alive_until = clock_timestamp() + $2 * interval '1 millisecond'
             WHERE owner = $1",
        )
        .bind(&self.owner)
        .bind(millis(self.lease))
        .execute(&self.pool)
        .await
        .map(drop)
    }
}

#[async_trait::async_trait]
impl LimitLedger for PgLimitLedger {
    async fn reserve(
        &self,
        provider: &str,
        limits: &ProviderLimits,
        ask: Ask,
    ) -> Result<Reserve, LedgerError> {
        let (id, wait_ms): (Option<i64>, Option<i64>) = sqlx::query_as(
            "SELECT id, wait_ms FROM rein_limit_reserve($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(provider)
        .bind(&self.owner)
        .bind(millis(self.lease))
        .bind(cap(Some(ask.tokens)))
        .bind(cap(limits.requests_per_window()))
        .bind(cap(limits.tokens_per_window()))
        .bind(cap(limits.max_concurrent))
        .bind(millis(limits.window_duration()))
        .bind(ask.waiter.map(|w| i64::try_from(w.id).unwrap_or(i64::MAX)))
        .fetch_one(&self.pool)
        .await
        .map_err(|e| failed(&e))?;
        Ok(match id {
            Some(id) => Reserve::Admitted(u64::try_from(id).unwrap_or_default()),
            None => Reserve::Wait(
                wait_ms.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or_default())),
            ),
        })
    }

    async fn settle(
        &self,
        _provider: &str,
        id: u64,
        tokens: u64,
        received_ago: Duration,
    ) -> Result<(), LedgerError> {
        sqlx::query("SELECT rein_limit_settle($1, $2, $3)")
            .bind(i64::try_from(id).unwrap_or(i64::MAX))
            .bind(cap(Some(tokens)))
            .bind(millis(received_ago))
            .execute(&self.pool)
            .await
            .map(drop)
            .map_err(|e| failed(&e))
    }

    async fn pause(&self, provider: &str, duration: Duration) -> Result<(), LedgerError> {
        sqlx::query(
            "INSERT INTO rein_limit_pauses AS p (provider, until)
             VALUES ($1, clock_timestamp() + $2 * interval '1 millisecond')
             ON CONFLICT (provider) DO UPDATE SET until = GREATEST(p.until, EXCLUDED.until)",
        )
        .bind(provider)
        .bind(millis(duration))
        .execute(&self.pool)
        .await
        .map(drop)
        .map_err(|e| failed(&e))
    }

    async fn wait(&self, provider: &str, waiter: Waiter) -> Result<(), LedgerError> {
        sqlx::query(
            "WITH alive AS (
                 INSERT INTO rein_limit_owners AS o (owner, alive_until)
                 VALUES ($2, clock_timestamp() + $4 * interval '1 millisecond')
                 ON CONFLICT (owner) DO UPDATE
                 SET alive_until = GREATEST(o.alive_until, EXCLUDED.alive_until)
             )
             INSERT INTO rein_limit_waiters (provider, owner, waiter, since)
             VALUES ($1, $2, $3, clock_timestamp()) ON CONFLICT DO NOTHING",
        )
        .bind(provider)
        .bind(&self.owner)
        .bind(i64::try_from(waiter.id).unwrap_or(i64::MAX))
        .bind(millis(self.lease))
        .execute(&self.pool)
        .await
        .map(drop)
        .map_err(|e| failed(&e))
    }

    async fn forget(&self, provider: &str, waiter: Waiter) -> Result<(), LedgerError> {
        sqlx::query(
            "DELETE FROM rein_limit_waiters WHERE provider = $1 AND owner = $2 AND waiter = $3",
        )
        .bind(provider)
        .bind(&self.owner)
        .bind(i64::try_from(waiter.id).unwrap_or(i64::MAX))
        .execute(&self.pool)
        .await
        .map(drop)
        .map_err(|e| failed(&e))
    }

    async fn usage(&self, provider: &str) -> Result<LedgerUsage, LedgerError> {
        let (requests, tokens, in_flight, waiting, paused_ms): (i64, i64, i64, i64, Option<i64>) =
            sqlx::query_as(
                "SELECT
                   (SELECT count(*) FROM rein_limit_reservations r
                     WHERE r.provider = $1
                       AND (r.counts_until IS NULL OR r.counts_until > clock_timestamp())),
                   (SELECT COALESCE(sum(r.tokens), 0)::BIGINT FROM rein_limit_reservations r
                     WHERE r.provider = $1
                       AND (r.counts_until IS NULL OR r.counts_until > clock_timestamp())),
                   (SELECT count(*) FROM rein_limit_reservations r
                     JOIN rein_limit_owners o ON o.owner = r.owner
                     WHERE r.provider = $1 AND r.counts_until IS NULL
                       AND o.alive_until > clock_timestamp()),
                   (SELECT count(*) FROM rein_limit_waiters w JOIN rein_limit_owners o ON o.owner = w.owner
                     WHERE w.provider = $1 AND o.alive_until > clock_timestamp()),
                   (SELECT ceil(extract(epoch FROM p.until - clock_timestamp()) * 1000)::BIGINT
                     FROM rein_limit_pauses p WHERE p.provider = $1 AND p.until > clock_timestamp())",
            )
            .bind(provider)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| failed(&e))?;
        let n = |v: i64| u64::try_from(v).unwrap_or_default();
        Ok(LedgerUsage {
            requests: n(requests),
            tokens: n(tokens),
            in_flight: n(in_flight),
            waiting: n(waiting),
            paused_ms: paused_ms.map(n),
        })
    }
}
