//! How a layer extends a runtime without the engine knowing it: typed
//! values kept by the runtime ([`Extensions`]) and observers told about
//! every run's end, thread cancellations and deletions ([`RunObserver`]).
//!
//! Auto mode (`crate::auto`) is built on exactly these surfaces, the same
//! ones any user extension has: its settings are an extension value set on
//! the builder, its per-thread sessions an extension value created on first
//! use, and it learns about runs through an observer.
//!
//! **Invariant:** the engine never names a layer: nothing in `agent_loop`,
//! `runtime`, `mailbox` or `builder` imports `auto` (checked by the
//! `architecture_map` test).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use dashmap::DashMap;

use crate::run::AgentRunResult;

/// Told about every run of a runtime, and about threads cancelled or
/// deleted through the runtime. All methods are called synchronously on the
/// caller's task: keep them cheap.
pub trait RunObserver: Send + Sync {
    /// A run ended. Called on the run's task after `RunFinished` was
    /// emitted and before the run releases its thread, so the thread's next
    /// run starts after this returns.
    fn run_finished(&self, result: &AgentRunResult);

    /// `cancel_by_thread` or `cancel_and_wait_by_thread` was called for
    /// `thread_id`. Return `true` if this observer stopped something of its
    /// own there (the cancel call then reports `true` even without an active
    /// run). The default does nothing.
    fn thread_cancelled(&self, thread_id: &str) -> bool {
        let _ = thread_id;
        false
    }

    /// `delete_thread` removed `thread_id`: drop what is kept for it. The
    /// default does nothing.
    fn thread_deleted(&self, thread_id: &str) {
        let _ = thread_id;
    }
}

/// Typed values a runtime keeps for its layers, at most one per type.
///
/// Values set on the builder ([`AgentRuntimeBuilder::with_extension`](crate::AgentRuntimeBuilder::with_extension))
/// are there from the start; others are created on first use
/// ([`AgentRuntime::extension_or_insert_with`](crate::AgentRuntime::extension_or_insert_with)).
#[derive(Default)]
pub(crate) struct Extensions {
    values: DashMap<TypeId, Arc<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for Extensions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extensions")
            .field("values", &self.values.len())
            .finish()
    }
}

impl Extensions {
    pub(crate) fn from_builder(values: HashMap<TypeId, Box<dyn Any + Send + Sync>>) -> Self {
        let map = DashMap::new();
        for (id, value) in values {
            map.insert(id, Arc::<dyn Any + Send + Sync>::from(value));
        }
        Self { values: map }
    }

    pub(crate) fn get<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        let value = self.values.get(&TypeId::of::<T>())?.value().clone();
        value.downcast::<T>().ok()
    }

    /// The value of type `T`, created by `init` if there is none. `init`
    /// runs at most once per type, under the map's shard lock: it must not
    /// touch the extensions itself.
    ///
    /// # Panics
    ///
    /// Never: entries are keyed by their value's type id.
    pub(crate) fn get_or_insert_with<T: Any + Send + Sync>(
        &self,
        init: impl FnOnce() -> T,
    ) -> Arc<T> {
        let value = self
            .values
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Arc::new(init()))
            .value()
            .clone();
        // Entries are keyed by their value's own type id, so the downcast
        // cannot fail.
        #[allow(clippy::expect_used)]
        value
            .downcast::<T>()
            .expect("an extension entry holds a value of its key's type")
    }
}

/// The observers of a runtime: set on the builder or added later.
#[derive(Default)]
pub(crate) struct Observers {
    list: RwLock<Vec<Arc<dyn RunObserver>>>,
}

impl std::fmt::Debug for Observers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observers")
            .field("count", &self.snapshot().len())
            .finish()
    }
}

impl Observers {
    pub(crate) fn new(list: Vec<Arc<dyn RunObserver>>) -> Self {
        Self {
            list: RwLock::new(list),
        }
    }

    pub(crate) fn add(&self, observer: Arc<dyn RunObserver>) {
        self.list
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(observer);
    }

    fn snapshot(&self) -> Vec<Arc<dyn RunObserver>> {
        self.list.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn run_finished(&self, result: &AgentRunResult) {
        let list = self.list.read().unwrap_or_else(|e| e.into_inner());
        for observer in list.iter() {
            observer.run_finished(result);
        }
    }

    pub(crate) fn thread_cancelled(&self, thread_id: &str) -> bool {
        let mut any = false;
        for observer in self.snapshot() {
            any |= observer.thread_cancelled(thread_id);
        }
        any
    }

    pub(crate) fn thread_deleted(&self, thread_id: &str) {
        for observer in self.snapshot() {
            observer.thread_deleted(thread_id);
        }
    }
}
