//! Provider limits: admission before spending.
//!
//! A provider account allows so many requests and tokens per minute, and
//! perhaps so many requests at once. Instead of finding the limit by
//! hitting it (a 429 per run, each run backing off alone), every inference
//! on a limited provider first **reserves** one request and its estimated
//! tokens — the prompt estimate plus the output reserve — and waits while
//! the limits are used up. The answer's reported usage then corrects the
//! reservation.
//!
//! The model:
//! - [`ProviderLimits`] are a provider's limits, each optional.
//! - A [`LimitLedger`] keeps what is reserved: [`InMemoryLedger`] for one
//!   process; the PostgreSQL ledger (`rein-postgres`) for a cluster, so
//!   one set of limits holds however many processes serve.
//! - A [`ProviderGate`] is one process's door to one provider: it queues
//!   the runs that wait, in the order they began waiting, and only the
//!   head of the queue asks the ledger. A shared ledger admits the process
//!   whose oldest waiter has waited longest, which keeps the order global.
//!
//! **Invariant:** (architecture.md, invariant 10)
//! - A reservation counts from the moment it is made until one window
//!   after the provider answered (its first byte; the answer's end when it
//!   never answered): the provider received the request in between, so
//!   the ledger never counts less than the provider does.
//! - A wait is not an inference: it is no round, no error, and does not
//!   touch `consecutive_errors` or `error_rate`.
//! - A 429 (or `Retry-After`) pauses the provider for every run, in every
//!   process sharing the ledger.

mod memory;

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use memory::InMemoryLedger;

/// The longest a waiting run sleeps before it asks the ledger again, when
/// the ledger cannot say when room frees up (answers still in flight, or a
/// settle in another process).
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// The output reserve of an inference whose model sets no
/// `max_output_tokens` (and whose context policy reserves nothing).
pub const DEFAULT_OUTPUT_RESERVE: u64 = 1024;

/// A provider's limits; each is optional. The per-minute rates are
/// enforced over a sliding window (`window_ms`, one minute by default): in
/// any window, at most `rate × window / 1 min` requests and tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ProviderLimits {
    /// Requests per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u64>,
    /// Tokens (prompt and answer) per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u64>,
    /// Requests in flight at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u64>,
    /// The window the rates are enforced over, in milliseconds (default
    /// 60 000). A shorter window spreads the same rate more evenly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<u64>,
}

impl ProviderLimits {
    /// No limits.
    pub fn new() -> Self {
        Self::default()
    }

    /// With a requests-per-minute limit.
    #[must_use]
    pub fn requests_per_minute(mut self, n: u64) -> Self {
        self.requests_per_minute = Some(n);
        self
    }

    /// With a tokens-per-minute limit.
    #[must_use]
    pub fn tokens_per_minute(mut self, n: u64) -> Self {
        self.tokens_per_minute = Some(n);
        self
    }

    /// With a limit on requests in flight.
    #[must_use]
    pub fn max_concurrent(mut self, n: u64) -> Self {
        self.max_concurrent = Some(n);
        self
    }

    /// With the window the rates are enforced over.
    #[must_use]
    pub fn window(mut self, window: Duration) -> Self {
        self.window_ms = Some(u64::try_from(window.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// The window the rates are enforced over.
    pub fn window_duration(&self) -> Duration {
        Duration::from_millis(self.window_ms.unwrap_or(60_000))
    }

    /// The requests allowed in one window.
    pub fn requests_per_window(&self) -> Option<u64> {
        self.requests_per_minute.map(|r| self.per_window(r))
    }

    /// The tokens allowed in one window.
    pub fn tokens_per_window(&self) -> Option<u64> {
        self.tokens_per_minute.map(|t| self.per_window(t))
    }

    fn per_window(&self, per_minute: u64) -> u64 {
        let window = u128::from(self.window_ms.unwrap_or(60_000));
        u64::try_from(u128::from(per_minute) * window / 60_000)
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Whether any limit is set.
    pub fn is_limited(&self) -> bool {
        self.requests_per_minute.is_some()
            || self.tokens_per_minute.is_some()
            || self.max_concurrent.is_some()
    }

    /// Checks the values: each set limit at least 1, the window between
    /// 100 ms and one hour.
    ///
    /// # Errors
    ///
    /// The first bad value, naming its key.
    pub fn validate(&self) -> Result<(), String> {
        for (key, value) in [
            ("requests_per_minute", self.requests_per_minute),
            ("tokens_per_minute", self.tokens_per_minute),
            ("max_concurrent", self.max_concurrent),
        ] {
            if value == Some(0) {
                return Err(format!(
                    "{key} is 0: no request could ever be sent; leave it out for no limit, or set it to at least 1"
                ));
            }
        }
        if let Some(w) = self.window_ms
            && !(100..=3_600_000).contains(&w)
        {
            return Err(format!(
                "window_ms is {w}: it must be between 100 and 3600000 (one hour)"
            ));
        }
        Ok(())
    }
}

/// What one inference asks of a ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    /// The tokens to reserve (already clamped to one window's allowance).
    pub tokens: u64,
    /// The waiter asking, when it had to queue (recorded with
    /// [`LimitLedger::wait`]). Older waiters (in any process) go first.
    pub waiter: Option<Waiter>,
}

/// A queued inference. A ledger shared between processes records when it
/// began waiting ([`LimitLedger::wait`], on its own clock) and orders
/// waiters by that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiter {
    /// Unique within the process.
    pub id: u64,
}

/// A ledger's answer to an [`Ask`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserve {
    /// Reserved, under this id (for [`LimitLedger::settle`]).
    Admitted(u64),
    /// Not now: ask again after this long (when the ledger knows when room
    /// frees up), or when something settles (`None`).
    Wait(Option<Duration>),
}

/// What a provider's ledger holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LedgerUsage {
    /// Requests counted in the current window (in flight included).
    pub requests: u64,
    /// Tokens counted in the current window (in flight included).
    pub tokens: u64,
    /// Requests in flight.
    pub in_flight: u64,
    /// Inferences queued, in every process sharing the ledger that reports
    /// them (this process's are always counted).
    pub waiting: u64,
    /// How long the provider stays paused by a 429, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_ms: Option<u64>,
}

/// A ledger failed (its database could not be reached).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("provider limits ledger: {0}")]
pub struct LedgerError(pub String);

/// Where reservations are kept. One ledger serves every limited provider;
/// an implementation shared between processes makes the limits hold for
/// the cluster.
#[async_trait::async_trait]
pub trait LimitLedger: Send + Sync + fmt::Debug {
    /// Reserves one request and `ask.tokens` on `provider`, or says when to
    /// ask again. A shared ledger admits no waiter while an older one (of
    /// another live process) waits.
    async fn reserve(
        &self,
        provider: &str,
        limits: &ProviderLimits,
        ask: Ask,
    ) -> Result<Reserve, LedgerError>;

    /// Replaces reservation `id`'s tokens by what the answer used; it counts
    /// until one window after `received_ago` before now — when the provider
    /// is known to have received the request (it answered), or now.
    async fn settle(
        &self,
        provider: &str,
        id: u64,
        tokens: u64,
        received_ago: Duration,
    ) -> Result<(), LedgerError>;

    /// Pauses `provider` for `duration` (a 429's `Retry-After`): nothing is
    /// admitted until then.
    async fn pause(&self, provider: &str, duration: Duration) -> Result<(), LedgerError>;

    /// Records that `waiter` began waiting (a shared ledger orders waiters
    /// of every process by this, and counts them in
    /// [`usage`](Self::usage)).
    async fn wait(&self, provider: &str, waiter: Waiter) -> Result<(), LedgerError>;

    /// Forgets a waiter that stopped waiting (cancelled) before it was
    /// admitted.
    async fn forget(&self, provider: &str, waiter: Waiter) -> Result<(), LedgerError>;

    /// What `provider`'s window holds now.
    async fn usage(&self, provider: &str) -> Result<LedgerUsage, LedgerError>;
}

/// One provider's limits as `GET /v1/providers` shows them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProviderStatus {
    /// The provider id.
    pub id: String,
    /// Its limits (none set: not limited).
    pub limits: ProviderLimits,
    /// What its window holds now (absent when not limited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<LedgerUsage>,
    /// Why the usage could not be read, when it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How an admission ended without a reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The run was cancelled (or passed its deadline) while waiting.
    Cancelled,
    /// The ledger failed.
    Ledger(LedgerError),
}

/// One process's door to one limited provider: a FIFO queue in front of
/// the ledger.
pub struct ProviderGate {
    provider: String,
    limits: ProviderLimits,
    ledger: Arc<dyn LimitLedger>,
    /// Waiter numbers, in the order they began waiting.
    queue: std::sync::Mutex<VecDeque<u64>>,
    next: AtomicU64,
    /// Woken when the queue's head changes or something settles here.
    turn: Notify,
}

impl fmt::Debug for ProviderGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderGate")
            .field("provider", &self.provider)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl ProviderGate {
    /// A gate for `provider` with `limits`, reserving in `ledger`.
    pub fn new(
        provider: impl Into<String>,
        limits: ProviderLimits,
        ledger: Arc<dyn LimitLedger>,
    ) -> Arc<Self> {
        Arc::new(Self {
            provider: provider.into(),
            limits,
            ledger,
            queue: std::sync::Mutex::new(VecDeque::new()),
            next: AtomicU64::new(1),
            turn: Notify::new(),
        })
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<u64>> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The provider id.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The limits.
    pub fn limits(&self) -> &ProviderLimits {
        &self.limits
    }

    /// Whether inferences reserve tokens (a tokens-per-minute limit is
    /// set): their prompts must then be estimated.
    pub fn counts_tokens(&self) -> bool {
        self.limits.tokens_per_minute.is_some()
    }

    /// Inferences queued in this process.
    pub fn waiting(&self) -> u64 {
        self.queue().len() as u64
    }

    /// Reserves one request and `tokens` (clamped to one window's
    /// allowance: a prompt larger than the window waits for an empty one),
    /// waiting in line while the limits are used up. `on_wait` is called
    /// once, with the ledger's first estimate of the wait, if the call has
    /// to wait at all.
    ///
    /// # Cancel safety
    ///
    /// Cancelling `cancel` ends the wait at once with
    /// [`Refused::Cancelled`]; nothing is reserved and the place in line is
    /// given up. Dropping the future mid-wait also gives up the place.
    ///
    /// # Errors
    ///
    /// [`Refused`]: cancelled, or the ledger failed.
    pub async fn admit(
        self: &Arc<Self>,
        tokens: u64,
        cancel: &CancellationToken,
        on_wait: impl FnOnce(Duration),
    ) -> Result<Permit, Refused> {
        let tokens = self
            .limits
            .tokens_per_window()
            .map_or(tokens, |cap| tokens.min(cap));
        let admitted = |id| Permit {
            gate: self.clone(),
            id,
            reserved: tokens,
            settled: false,
            received: None,
        };
        // The fast path: nobody in line here, and room in the ledger.
        if self.queue().is_empty() {
            let ask = Ask {
                tokens,
                waiter: None,
            };
            match self.ask(ask).await? {
                Reserve::Admitted(id) => return Ok(admitted(id)),
                Reserve::Wait(_) => {}
            }
        }
        let waiter = Waiter {
            id: self.next.fetch_add(1, Ordering::Relaxed),
        };
        self.queue().push_back(waiter.id);
        let mut place = Place {
            gate: self,
            waiter,
            done: false,
        };
        self.ledger
            .wait(&self.provider, waiter)
            .await
            .map_err(Refused::Ledger)?;
        let mut on_wait = Some(on_wait);
        loop {
            let turn = self.turn.notified();
            tokio::pin!(turn);
            turn.as_mut().enable();
            let position = self.queue().iter().position(|&w| w == waiter.id);
            let (pause, expected) = if position == Some(0) {
                let ask = Ask {
                    tokens,
                    waiter: Some(waiter),
                };
                match self.ask(ask).await {
                    Ok(Reserve::Admitted(id)) => {
                        place.leave(false);
                        return Ok(admitted(id));
                    }
                    Ok(Reserve::Wait(after)) => (
                        after.map_or(POLL_INTERVAL, |d| d.min(POLL_INTERVAL)),
                        after.unwrap_or(POLL_INTERVAL),
                    ),
                    Err(error) => return Err(error),
                }
            } else {
                // Not first in line: the head's turn ends with a notify.
                let ahead = position.unwrap_or_default();
                (
                    Duration::from_secs(3600),
                    self.pace() * u32::try_from(ahead).unwrap_or(u32::MAX),
                )
            };
            if let Some(report) = on_wait.take() {
                report(expected);
            }
            tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(Refused::Cancelled),
                () = &mut turn => {}
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    async fn ask(&self, ask: Ask) -> Result<Reserve, Refused> {
        self.ledger
            .reserve(&self.provider, &self.limits, ask)
            .await
            .map_err(Refused::Ledger)
    }

    /// The window's average time between two requests (zero without a
    /// request limit): a waiter's first estimate is this per waiter ahead.
    fn pace(&self) -> Duration {
        let window = self.limits.window_duration();
        self.limits
            .requests_per_window()
            .map_or(Duration::ZERO, |r| {
                window / u32::try_from(r).unwrap_or(u32::MAX).max(1)
            })
    }

    /// Pauses the provider for every run (a 429 said to wait `duration`).
    ///
    /// # Cancel safety
    ///
    /// One ledger write: dropped midway, the pause is recorded or not.
    pub async fn pause(&self, duration: Duration) {
        if let Err(error) = self.ledger.pause(&self.provider, duration).await {
            tracing::warn!(provider = %self.provider, %error, "could not record the provider's pause");
        }
    }

    /// The provider as `GET /v1/providers` shows it.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping it loses nothing.
    pub async fn status(&self) -> ProviderStatus {
        let (usage, error) = match self.ledger.usage(&self.provider).await {
            Ok(mut usage) => {
                usage.waiting = usage.waiting.max(self.waiting());
                (Some(usage), None)
            }
            Err(error) => (None, Some(error.to_string())),
        };
        ProviderStatus {
            id: self.provider.clone(),
            limits: self.limits,
            usage,
            error,
        }
    }
}

/// A waiter's place in line; leaving it (or dropping it) wakes the next.
struct Place<'a> {
    gate: &'a Arc<ProviderGate>,
    waiter: Waiter,
    done: bool,
}

impl Place<'_> {
    fn leave(&mut self, forget: bool) {
        if self.done {
            return;
        }
        self.done = true;
        self.gate.queue().retain(|&w| w != self.waiter.id);
        self.gate.turn.notify_waiters();
        if forget {
            let gate = self.gate.clone();
            let waiter = self.waiter;
            spawn_detached(async move {
                if let Err(error) = gate.ledger.forget(&gate.provider, waiter).await {
                    tracing::debug!(provider = %gate.provider, %error, "could not forget a waiter");
                }
            });
        }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.leave(true);
    }
}

/// Runs `work` on the current tokio runtime, when there is one.
fn spawn_detached(work: impl Future<Output = ()> + Send + 'static) {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(work);
    }
}

/// A reservation: settle it with what the answer used. Dropped unsettled,
/// it settles with what it reserved.
#[derive(Debug)]
pub struct Permit {
    gate: Arc<ProviderGate>,
    id: u64,
    reserved: u64,
    settled: bool,
    /// When the provider answered (so had the request).
    received: Option<tokio::time::Instant>,
}

impl Permit {
    /// The tokens reserved.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Notes that the provider answered (its first byte): the request
    /// counts in the window from then, not from when the answer ends.
    pub fn received(&mut self) {
        self.received.get_or_insert_with(tokio::time::Instant::now);
    }

    fn received_ago(&self) -> Duration {
        self.received.map_or(Duration::ZERO, |at| at.elapsed())
    }

    /// Settles the reservation with the tokens the answer used (`None`:
    /// unknown, what was reserved stands).
    ///
    /// # Cancel safety
    ///
    /// Dropped before the ledger answered, the reservation is settled by
    /// the permit's drop instead, with what it reserved.
    pub async fn settle(mut self, used: Option<u64>) {
        let tokens = used.unwrap_or(self.reserved);
        let gate = self.gate.clone();
        let ago = self.received_ago();
        let settled = gate
            .ledger
            .settle(&gate.provider, self.id, tokens, ago)
            .await;
        // Only now: dropped before this, the permit settles in its drop.
        self.settled = true;
        if let Err(error) = settled {
            tracing::warn!(provider = %gate.provider, %error, "could not settle a reservation");
        }
        gate.turn.notify_waiters();
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let (gate, id, tokens) = (self.gate.clone(), self.id, self.reserved);
        let ago = self.received_ago();
        spawn_detached(async move {
            let _ = gate.ledger.settle(&gate.provider, id, tokens, ago).await;
            gate.turn.notify_waiters();
        });
    }
}

#[cfg(test)]
mod tests;
