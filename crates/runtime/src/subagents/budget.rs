//! One token budget for a tree of runs: a [`Pool`] per run that has a
//! budget, linked to the nearest ancestor's.
//!
//! Before an inference a run reserves what the call may cost (its prompt,
//! estimated, plus the output it reserves) in its own pool and every
//! ancestor's, atomically at each level; when the answer comes, the
//! reservation is replaced by what the provider reported. So siblings
//! running at once can never together pass a budget one of them checked:
//! a call that does not fit anywhere up the chain is not sent.
//!
//! **Invariant:** a pool's `used` (spent plus reserved) never passes its
//! `limit` by a reservation; only a provider reporting more than was
//! reserved can take it past.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The token budget of one run in a tree.
#[derive(Debug)]
pub(crate) struct Pool {
    /// The run whose budget this is (for the refusal's words).
    pub(crate) run_id: Arc<str>,
    limit: u64,
    /// Tokens spent and reserved by this run and its descendants.
    used: AtomicU64,
    parent: Option<Arc<Pool>>,
}

/// A reservation that did not fit: the pool that refused it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) run_id: Arc<str>,
    pub(crate) limit: u64,
    pub(crate) used: u64,
}

impl Pool {
    /// A pool of `limit` tokens under `parent` (if any), of which `spent`
    /// are already spent.
    pub(crate) fn new(run_id: Arc<str>, limit: u64, parent: Option<Arc<Pool>>) -> Arc<Self> {
        Arc::new(Self {
            run_id,
            limit,
            used: AtomicU64::new(0),
            parent,
        })
    }

    /// What is left here and in every ancestor: the least of them.
    pub(crate) fn remaining(&self) -> u64 {
        let here = self.limit.saturating_sub(self.used.load(Ordering::Acquire));
        match &self.parent {
            Some(parent) => here.min(parent.remaining()),
            None => here,
        }
    }

    /// Reserves `tokens` here and in every ancestor, or nowhere.
    pub(crate) fn reserve(&self, tokens: u64) -> Result<(), Refused> {
        self.try_add(tokens)?;
        if let Some(parent) = &self.parent
            && let Err(refused) = parent.reserve(tokens)
        {
            self.used.fetch_sub(tokens, Ordering::AcqRel);
            return Err(refused);
        }
        Ok(())
    }

    /// Replaces a reservation of `reserved` tokens by the `spent` ones,
    /// here and in every ancestor.
    pub(crate) fn settle(&self, reserved: u64, spent: u64) {
        if spent >= reserved {
            self.used.fetch_add(spent - reserved, Ordering::AcqRel);
        } else {
            self.used.fetch_sub(reserved - spent, Ordering::AcqRel);
        }
        if let Some(parent) = &self.parent {
            parent.settle(reserved, spent);
        }
    }

    /// Adds `tokens` here if they fit under the limit.
    fn try_add(&self, tokens: u64) -> Result<(), Refused> {
        let mut used = self.used.load(Ordering::Acquire);
        loop {
            let next = used.saturating_add(tokens);
            if next > self.limit {
                return Err(Refused {
                    run_id: self.run_id.clone(),
                    limit: self.limit,
                    used,
                });
            }
            match self
                .used
                .compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(()),
                Err(now) => used = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_that_an_ancestor_cannot_pay_is_made_nowhere() {
        let root = Pool::new("root".into(), 100, None);
        let child = Pool::new("child".into(), 80, Some(root.clone()));
        root.reserve(50).unwrap();
        let refused = child.reserve(60).unwrap_err();
        assert_eq!(&*refused.run_id, "root");
        assert_eq!(child.remaining(), 50);
        child.reserve(50).unwrap();
        assert_eq!(root.remaining(), 0);
        child.settle(50, 20);
        assert_eq!(child.remaining(), 30);
        assert_eq!(root.remaining(), 30);
    }

    #[test]
    fn siblings_reserving_at_once_never_pass_the_root_s_limit() {
        for _ in 0..200 {
            let root = Pool::new("root".into(), 1000, None);
            let threads: Vec<_> = (0..8)
                .map(|i| {
                    let child = Pool::new(format!("c{i}").into(), 10_000, Some(root.clone()));
                    std::thread::spawn(move || (0..50).filter(|_| child.reserve(7).is_ok()).count())
                })
                .collect();
            let granted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
            assert_eq!(granted, 1000 / 7, "exactly what fits was granted");
            assert!(root.used.load(Ordering::Acquire) <= 1000);
        }
    }
}
