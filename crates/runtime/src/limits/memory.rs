//! [`InMemoryLedger`]: one process's reservations, per provider a sliding
//! window of settled reservations (each counted until one window after it
//! settled) and the reservations in flight.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::{Ask, LedgerError, LedgerUsage, LimitLedger, ProviderLimits, Reserve, Waiter};

/// Reservations kept in this process: limits hold for the runs of one
/// runtime (or of every runtime given the same ledger).
#[derive(Debug, Default)]
pub struct InMemoryLedger {
    books: Mutex<HashMap<String, Book>>,
}

impl InMemoryLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    fn with_book<T>(&self, provider: &str, f: impl FnOnce(&mut Book, Instant) -> T) -> T {
        let mut books = self.books.lock().unwrap_or_else(PoisonError::into_inner);
        let book = match books.get_mut(provider) {
            Some(book) => book,
            None => books.entry(provider.to_owned()).or_default(),
        };
        f(book, Instant::now())
    }
}

/// One provider's window.
#[derive(Debug, Default)]
struct Book {
    next_id: u64,
    /// In flight: id → tokens reserved.
    in_flight: HashMap<u64, u64>,
    in_flight_tokens: u64,
    /// Settled, oldest first: when each stops counting, and its tokens.
    settled: VecDeque<(Instant, u64)>,
    settled_tokens: u64,
    paused_until: Option<Instant>,
    /// The window of the limits last asked with.
    window: Duration,
}

impl Book {
    /// Drops the settled reservations whose window has passed.
    fn expire(&mut self, now: Instant) {
        while let Some(&(until, tokens)) = self.settled.front() {
            if until > now {
                break;
            }
            self.settled.pop_front();
            self.settled_tokens -= tokens;
        }
    }

    /// When the window has room for one more request, and for `tokens`
    /// more tokens, if it has none now: `Some(None)` when only a settle
    /// can make room.
    fn room(&self, limits: &ProviderLimits, tokens: u64, now: Instant) -> Option<Option<Duration>> {
        if let Some(until) = self.paused_until
            && until > now
        {
            return Some(Some(until - now));
        }
        let in_flight = self.in_flight.len() as u64;
        if limits.max_concurrent.is_some_and(|m| in_flight >= m) {
            return Some(None);
        }
        let mut wait: Option<Instant> = None;
        if let Some(cap) = limits.requests_per_window() {
            let counted = in_flight + self.settled.len() as u64;
            if counted >= cap {
                // The settled reservation whose expiry brings the count below cap.
                let excess = usize::try_from(counted - cap).unwrap_or(usize::MAX);
                match self.settled.get(excess) {
                    Some(&(until, _)) => wait = wait.max(Some(until)),
                    None => return Some(None),
                }
            }
        }
        if let Some(cap) = limits.tokens_per_window() {
            let counted = self.in_flight_tokens + self.settled_tokens;
            if counted + tokens > cap {
                let mut to_free = counted + tokens - cap;
                let mut at = None;
                for &(until, t) in &self.settled {
                    if to_free == 0 {
                        break;
                    }
                    to_free = to_free.saturating_sub(t);
                    at = Some(until);
                }
                if to_free > 0 {
                    return Some(None);
                }
                wait = wait.max(at);
            }
        }
        wait.map(|at| Some(at.saturating_duration_since(now)))
    }
}

#[async_trait::async_trait]
impl LimitLedger for InMemoryLedger {
    async fn reserve(
        &self,
        provider: &str,
        limits: &ProviderLimits,
        ask: Ask,
    ) -> Result<Reserve, LedgerError> {
        Ok(self.with_book(provider, |book, now| {
            book.window = limits.window_duration();
            book.expire(now);
            if let Some(wait) = book.room(limits, ask.tokens, now) {
                return Reserve::Wait(wait);
            }
            book.next_id += 1;
            book.in_flight.insert(book.next_id, ask.tokens);
            book.in_flight_tokens += ask.tokens;
            Reserve::Admitted(book.next_id)
        }))
    }

    async fn settle(
        &self,
        provider: &str,
        id: u64,
        tokens: u64,
        received_ago: Duration,
    ) -> Result<(), LedgerError> {
        self.with_book(provider, |book, now| {
            if let Some(reserved) = book.in_flight.remove(&id) {
                book.in_flight_tokens -= reserved;
                let from = now.checked_sub(received_ago).unwrap_or(now);
                // Kept in expiry order: an answer that began earlier than a
                // later-settled one's may not jump ahead of it.
                let until = (from + book.window).max(book.settled.back().map_or(from, |b| b.0));
                book.settled.push_back((until, tokens));
                book.settled_tokens += tokens;
            }
        });
        Ok(())
    }

    async fn pause(&self, provider: &str, duration: Duration) -> Result<(), LedgerError> {
        self.with_book(provider, |book, now| {
            let until = now + duration;
            book.paused_until = book.paused_until.max(Some(until));
        });
        Ok(())
    }

    async fn wait(&self, _provider: &str, _waiter: Waiter) -> Result<(), LedgerError> {
        // Waiters are queued by the gate; this ledger keeps none.
        Ok(())
    }

    async fn forget(&self, _provider: &str, _waiter: Waiter) -> Result<(), LedgerError> {
        // Waiters are queued by the gate; this ledger keeps none.
        Ok(())
    }

    async fn usage(&self, provider: &str) -> Result<LedgerUsage, LedgerError> {
        Ok(self.with_book(provider, |book, now| {
            book.expire(now);
            LedgerUsage {
                requests: book.in_flight.len() as u64 + book.settled.len() as u64,
                tokens: book.in_flight_tokens + book.settled_tokens,
                in_flight: book.in_flight.len() as u64,
                waiting: 0,
                paused_ms: book
                    .paused_until
                    .filter(|&until| until > now)
                    .map(|until| u64::try_from((until - now).as_millis()).unwrap_or(u64::MAX)),
            }
        }))
    }
}
