//! The scan for work nobody does: threads with queued or running runs
//! whose owner is gone (released, or its lease expired), taken in fair
//! turns ([`PgRuns::orphaned`]).

use crate::PgRuns;

/// How long a new run is left to its submitter before the scan
/// ([`PgRuns::orphaned`]) counts its thread as work to take: a submitter
/// writes the run, then takes the thread; a scan in between would take it
/// instead, and the submitter would answer `queued` for a run another
/// process is already running.
pub const ORPHAN_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

impl PgRuns {
    /// Threads with queued or running runs that no live process owns (their
    /// owner released them, or its lease expired): work to take, at most
    /// 256 a scan. A thread whose parked run is waiting (nothing has made
    /// it due) is not work.
    ///
    /// A thread whose oldest open run is younger than [`ORPHAN_GRACE`] is
    /// left to the process that submitted it (unless a released parked
    /// run of it is due: no submitter will take it), which takes the thread
    /// itself right after writing the run; the scan is for work whose
    /// submitter or owner is gone.
    ///
    /// The scans are fair: they go round the orphaned threads in thread id
    /// order, each starting after the last thread the previous scan of this
    /// owner ([`Leases::owner`]) answered and wrapping around at the end.
    /// So with `n` orphaned threads, each is answered within `⌈n/256⌉`
    /// consecutive scans, whether or not the threads answered before it were
    /// taken. (Scans that each started at the first thread id answered the
    /// same 256 for as long as those stayed orphaned, and never the rest.)
    /// Where an owner's scans are is kept in this process; a new process
    /// starts at the first thread id.
    ///
    /// # Errors
    ///
    /// The database failed.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropped before it answers, the owner's cursor does not
    /// move.
    pub async fn orphaned(&self) -> Result<Vec<String>, sqlx::Error> {
        /// The most threads a scan answers.
        const LIMIT: usize = 256;
        /// A loose scan of `rein_runs_open` (one index probe per thread
        /// with work, however many runs are queued on it) from a first
        /// thread id on, keeping the orphaned threads (one probe of
        /// `rein_threads` each), the first `$3` in thread id order: `$1`
        /// the grace in seconds, `$2` the bound. The order is asked for:
        /// the rows of a join (as this scan had) need not come in the
        /// order of the scan, and then neither the limit nor the cursor
        /// follow the ids.
        macro_rules! scan {
            ($first:literal, $step:literal, $last:literal) => {
                concat!(
                    "WITH RECURSIVE open(thread_id) AS (
                         (SELECT thread_id FROM rein_runs WHERE status <> 'finished' ",
                    $first,
                    " ORDER BY thread_id LIMIT 1)
                         UNION ALL
                         SELECT (SELECT r.thread_id FROM rein_runs r
                                 WHERE r.status <> 'finished' AND r.thread_id > open.thread_id
                                 ORDER BY r.thread_id LIMIT 1)
                         FROM open WHERE open.thread_id IS NOT NULL ",
                    $step,
                    "
                     )
                     SELECT o.thread_id FROM open o
                     WHERE o.thread_id IS NOT NULL ",
                    $last,
                    "
                       AND COALESCE((SELECT (t.owner IS NULL OR t.lease_until < now()) IS TRUE
                                     FROM rein_threads t WHERE t.thread_id = o.thread_id), true)
                       AND NOT EXISTS (SELECT 1 FROM rein_runs w
                                       WHERE w.thread_id = o.thread_id AND ",
                    waiting!("w"),
                    ")
                       AND ((SELECT r.created_at FROM rein_runs r
                             WHERE r.thread_id = o.thread_id AND r.status <> 'finished'
                             ORDER BY r.seq LIMIT 1) < now() - make_interval(secs => $1)
                            OR EXISTS (SELECT 1 FROM rein_runs p
                                       WHERE p.thread_id = o.thread_id AND p.status = 'running'
                                         AND p.parked_calls IS NOT NULL))
                     ORDER BY o.thread_id
                     LIMIT $3"
                )
            };
        }
        /// The threads after the cursor (`$2`).
        const AFTER: &str = scan!("AND thread_id > $2", "", "");
        /// The threads up to the cursor (`$2`, inclusive; `NULL`: all).
        const UP_TO: &str = scan!(
            "",
            "AND ($2::text IS NULL OR open.thread_id < $2)",
            "AND ($2::text IS NULL OR o.thread_id <= $2)"
        );
        /// Each owner's cursor: the last thread its previous scan answered.
        /// Only where the next scan starts, so a lost one costs nothing but
        /// one round's order.
        static CURSORS: std::sync::Mutex<std::collections::BTreeMap<String, String>> =
            std::sync::Mutex::new(std::collections::BTreeMap::new());

        let owner = self.leases.owner();
        let cursor = CURSORS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(owner)
            .cloned();
        let grace = ORPHAN_GRACE.as_secs_f64();
        let mut threads: Vec<String> = match &cursor {
            Some(after) => {
                sqlx::query_scalar(AFTER)
                    .bind(grace)
                    .bind(after)
                    .bind(LIMIT as i64)
                    .fetch_all(&self.pool)
                    .await?
            }
            None => Vec::new(),
        };
        if threads.len() < LIMIT {
            // Round again from the first thread id, up to the cursor.
            let more: Vec<String> = sqlx::query_scalar(UP_TO)
                .bind(grace)
                .bind(cursor.as_deref())
                .bind((LIMIT - threads.len()) as i64)
                .fetch_all(&self.pool)
                .await?;
            threads.extend(more);
        }
        if let Some(last) = threads.last() {
            let mut cursors = CURSORS
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // A process has one owner; a test process has many, briefly.
            if cursors.len() >= 1024 && !cursors.contains_key(owner) {
                cursors.clear();
            }
            cursors.insert(owner.to_owned(), last.clone());
        }
        Ok(threads)
    }
}
