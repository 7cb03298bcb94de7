//! Where thread histories live between runs.
//!
//! A run loads its thread's history when it starts, appends its input at
//! once, appends each finished round, and appends the repaired tail when it
//! ends. A store that says it does not want each round
//! ([`ThreadStore::stores_each_round`]) gets a run's messages once, moved
//! in when the run ends (or parks). A store that keeps histories in memory
//! can instead lend the run the thread's own vector ([`ThreadStore::lend`],
//! the in-memory store): the run appends to it in place and shows each
//! finished round to readers. Only the run holding a thread's slot writes
//! to that thread, so a store needs no cross-run coordination.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use rein_runtime_contract::message::Message;

/// A failed store operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("thread store failed for thread \"{thread_id}\": {message}")]
pub struct ThreadStoreError {
    /// The thread.
    pub thread_id: String,
    /// What went wrong.
    pub message: String,
}

impl ThreadStoreError {
    /// An error for `thread_id`.
    pub fn new(thread_id: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            thread_id: thread_id.into(),
            message: message.into(),
        }
    }
}

/// Persistence of thread histories.
///
/// # Cancel safety
///
/// The runtime never drops a store future half-way except when the whole
/// runtime is torn down; implementations should still make each call atomic.
#[async_trait::async_trait]
pub trait ThreadStore: Send + Sync {
    /// The thread's history, oldest first; empty for an unknown thread.
    ///
    /// # Errors
    ///
    /// A [`ThreadStoreError`] when the history cannot be read.
    async fn load(&self, thread_id: &str) -> Result<Vec<Message>, ThreadStoreError>;

    /// Appends `messages` to the thread's history.
    ///
    /// # Errors
    ///
    /// A [`ThreadStoreError`] when nothing could be written.
    async fn append(&self, thread_id: &str, messages: &[Message]) -> Result<(), ThreadStoreError>;

    /// Appends `messages`, taking them: a store that keeps histories in
    /// memory keeps these instead of copying them. The default appends a
    /// borrow of them with [`append`](Self::append).
    ///
    /// # Errors
    ///
    /// A [`ThreadStoreError`] when nothing could be written.
    async fn append_owned(
        &self,
        thread_id: &str,
        messages: Vec<Message>,
    ) -> Result<(), ThreadStoreError> {
        self.append(thread_id, &messages).await
    }

    /// Whether a run stores each finished round as it ends (the default).
    /// `false`: a run stores its input and rounds once, when it ends or
    /// parks, with [`append_owned`](Self::append_owned), so a live run and
    /// the store do not both hold its messages; a thread read while a run
    /// is under way then shows the history as it was when the run started.
    /// A store that outlives the process should keep the default: what it
    /// holds is what survives a crash.
    fn stores_each_round(&self) -> bool {
        true
    }

    /// Lends the thread's history to the run that holds the thread, for a
    /// store that keeps histories in memory: the run appends to the
    /// store's own vector (through the [`LentHistory`]) instead of loading
    /// a copy and handing its messages over at the end. `None` (the
    /// default): the run loads a copy with [`load`](Self::load).
    ///
    /// Only the run holding the thread borrows it. A write from anyone else
    /// calls the loan off; the run's messages then join the thread after
    /// that write when it gives them back.
    fn lend(&self, thread_id: &str) -> Option<BorrowedHistory> {
        let _ = thread_id;
        None
    }

    /// Replaces the thread's whole history (used when a history loaded from
    /// the store needs repair).
    ///
    /// # Errors
    ///
    /// A [`ThreadStoreError`] when nothing could be written.
    async fn replace(&self, thread_id: &str, messages: &[Message]) -> Result<(), ThreadStoreError>;

    /// Forgets the thread: its history is gone and it loads as empty. The
    /// default replaces the history with an empty one; stores that keep an
    /// entry per thread should remove it.
    ///
    /// # Errors
    ///
    /// A [`ThreadStoreError`] when the history could not be removed.
    async fn delete(&self, thread_id: &str) -> Result<(), ThreadStoreError> {
        self.replace(thread_id, &[]).await
    }

    /// Whether histories outlive the process (a database). The agent loop
    /// then stores a round's assistant message with its tool calls before
    /// the calls run, so a process lost mid-call leaves them in the history
    /// for the next run (or the next owner) to answer as "may or may not
    /// have run". In memory that write would buy nothing. Default `false`.
    fn outlives_the_process(&self) -> bool {
        false
    }

    /// Takes `thread_id` for a sub-agent's child run before the child
    /// writes to it: a store that lets a thread be written only by the
    /// process that holds it (PostgreSQL's fenced store) takes the thread
    /// here, for the child's run. The default does nothing.
    ///
    /// # Errors
    ///
    /// A [`ThreadStoreError`] when the thread cannot be taken (another
    /// process holds it); the child does not start.
    async fn hold_for_child(&self, thread_id: &str) -> Result<(), ThreadStoreError> {
        let _ = thread_id;
        Ok(())
    }

    /// Gives up a thread taken with [`hold_for_child`](Self::hold_for_child)
    /// once the child's run has ended. The default does nothing.
    async fn release_child(&self, thread_id: &str) {
        let _ = thread_id;
    }
}

/// What [`ThreadStore::lend`] lends: the thread's history, shared with the
/// store, and the loan to change it through.
pub type BorrowedHistory = (Arc<Vec<Message>>, Box<dyn LentHistory>);

/// A thread's history lent to the run holding the thread
/// ([`ThreadStore::lend`]): the run and the store share one vector.
pub trait LentHistory: Send + Sync {
    /// Changes the run's `history` with `edit`, readers of the thread kept
    /// out meanwhile. The store lets go of its share first, so the change
    /// copies nothing unless someone else holds the vector too.
    fn edit(&self, history: &mut Arc<Vec<Message>>, edit: &mut dyn FnMut(&mut Vec<Message>));

    /// Readers of the thread see its first `len` messages from now on (the
    /// run's finished rounds).
    fn show(&self, len: usize);

    /// The run is over: `history` is the thread's, whole. If the loan was
    /// called off, only what the run added joins the thread.
    fn give_back(self: Box<Self>, history: Arc<Vec<Message>>);
}

/// A [`ThreadStore`] in process memory; histories are lost when it is dropped.
///
/// A thread's history is one shared vector: the run holding the thread
/// borrows it ([`ThreadStore::lend`]) and appends to it in place, so a run
/// start copies nothing however long the thread is, and a run's end moves
/// nothing. Readers see the thread's finished rounds as the run commits
/// them, never a round in progress. A brand-new thread is not lent: its
/// first run's messages are moved in when that run ends
/// ([`ThreadStore::stores_each_round`] is `false`).
#[derive(Debug, Default, Clone)]
pub struct InMemoryThreadStore {
    threads: Arc<DashMap<String, Slot>>,
    /// Numbers the loans, so a borrower whose loan was called off knows.
    loans: Arc<AtomicU64>,
}

/// One thread's history in an [`InMemoryThreadStore`].
#[derive(Debug, Default)]
struct Slot {
    /// The messages; `None` only while the borrower changes them (under
    /// the map's lock, so no reader sees it).
    history: Option<Arc<Vec<Message>>>,
    /// How many of `history`'s messages are the thread's. Beyond them: a
    /// borrower's round in progress, or what a borrower that vanished
    /// left unfinished (cut off at the next write).
    shown: usize,
    /// The loan out, if a run borrows the history.
    lent: Option<Loan>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Loan {
    id: u64,
    /// The thread's length when lent: what a called-off borrower's own
    /// messages follow.
    from: usize,
}

impl Slot {
    fn holding(messages: Vec<Message>) -> Self {
        Self {
            shown: messages.len(),
            history: Some(Arc::new(messages)),
            lent: None,
        }
    }

    /// Runs `write` on the thread's own messages ([`own`](Self::own)),
    /// all of which readers see then.
    fn write(&mut self, write: impl FnOnce(&mut Vec<Message>)) {
        let own = self.own();
        write(own);
        self.shown = own.len();
    }

    fn shown(&self) -> &[Message] {
        self.history
            .as_deref()
            .map_or(&[], |h| &h[..self.shown.min(h.len())])
    }

    /// The thread's own messages, to write to. A loan is called off: the
    /// thread goes back to what it held when lent, and the borrower's
    /// messages join after what is written now when it gives them back.
    /// Copies only when a borrower still shares the vector.
    fn own(&mut self) -> &mut Vec<Message> {
        let keep = match self.lent.take() {
            Some(loan) => loan.from,
            None => self.shown,
        };
        let history = self.history.get_or_insert_with(Default::default);
        // (Never more than it has: a borrower's edit that panicked
        // mid-way leaves no vector at all.)
        let keep = keep.min(history.len());
        if Arc::get_mut(history).is_none() {
            *history = Arc::new(history[..keep].to_vec());
        }
        // The store's alone now: this copies nothing.
        let own = Arc::make_mut(history);
        own.truncate(keep);
        own
    }
}

impl InMemoryThreadStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The ids of the threads with a history.
    pub fn thread_ids(&self) -> Vec<String> {
        self.threads.iter().map(|e| e.key().clone()).collect()
    }

    /// Runs `write` on the thread's own messages (calling off a loan).
    fn write(&self, thread_id: &str, write: impl FnOnce(&mut Vec<Message>)) {
        // A thread being written to usually exists: no key copied then.
        let mut slot = match self.threads.get_mut(thread_id) {
            Some(slot) => slot,
            None => self.threads.entry(thread_id.to_owned()).or_default(),
        };
        slot.write(write);
    }
}

#[async_trait::async_trait]
impl ThreadStore for InMemoryThreadStore {
    async fn load(&self, thread_id: &str) -> Result<Vec<Message>, ThreadStoreError> {
        Ok(self
            .threads
            .get(thread_id)
            .map(|slot| slot.shown().to_vec())
            .unwrap_or_default())
    }

    async fn append(&self, thread_id: &str, messages: &[Message]) -> Result<(), ThreadStoreError> {
        if !messages.is_empty() {
            self.write(thread_id, |history| history.extend_from_slice(messages));
        }
        Ok(())
    }

    async fn append_owned(
        &self,
        thread_id: &str,
        mut messages: Vec<Message>,
    ) -> Result<(), ThreadStoreError> {
        if messages.is_empty() {
            return Ok(());
        }
        self.write(thread_id, |history| {
            if history.is_empty() {
                // A new or emptied thread keeps the run's own vector (its
                // spare room given back).
                messages.shrink_to_fit();
                *history = messages;
            } else {
                history.append(&mut messages);
            }
        });
        Ok(())
    }

    fn stores_each_round(&self) -> bool {
        false
    }

    fn lend(&self, thread_id: &str) -> Option<BorrowedHistory> {
        let mut slot = self.threads.get_mut(thread_id)?;
        // Nothing to lend, or lent already (a borrower not yet gone): the
        // run loads a copy instead.
        if slot.shown == 0 || slot.lent.is_some() {
            return None;
        }
        let from = slot.shown;
        // Cuts off what a borrower that vanished left unshown.
        slot.own();
        let loan = Loan {
            id: self.loans.fetch_add(1, Ordering::Relaxed),
            from,
        };
        slot.lent = Some(loan);
        let shared = slot.history.clone()?;
        Some((
            shared,
            Box::new(Lease {
                threads: self.threads.clone(),
                thread_id: thread_id.to_owned(),
                loan,
                given_back: false,
            }),
        ))
    }

    async fn replace(&self, thread_id: &str, messages: &[Message]) -> Result<(), ThreadStoreError> {
        self.threads
            .insert(thread_id.to_owned(), Slot::holding(messages.to_vec()));
        Ok(())
    }

    async fn delete(&self, thread_id: &str) -> Result<(), ThreadStoreError> {
        self.threads.remove(thread_id);
        Ok(())
    }
}

/// An [`InMemoryThreadStore`]'s loan of one thread's history.
struct Lease {
    threads: Arc<DashMap<String, Slot>>,
    thread_id: String,
    loan: Loan,
    given_back: bool,
}

impl Lease {
    /// The thread's slot while the loan stands.
    fn slot(&self) -> Option<dashmap::mapref::one::RefMut<'_, String, Slot>> {
        self.threads
            .get_mut(self.thread_id.as_str())
            .filter(|slot| slot.lent == Some(self.loan))
    }
}

impl LentHistory for Lease {
    fn edit(&self, history: &mut Arc<Vec<Message>>, edit: &mut dyn FnMut(&mut Vec<Message>)) {
        match self.slot() {
            Some(mut slot) => {
                // The store lets go of its share first: the run's is then
                // the only one, and the change copies nothing.
                slot.history = None;
                edit(Arc::make_mut(history));
                slot.history = Some(history.clone());
            }
            None => edit(Arc::make_mut(history)),
        }
    }

    fn show(&self, len: usize) {
        if let Some(mut slot) = self.slot() {
            slot.shown = len;
        }
    }

    fn give_back(mut self: Box<Self>, history: Arc<Vec<Message>>) {
        self.given_back = true;
        if let Some(mut slot) = self.slot() {
            slot.shown = history.len();
            slot.history = Some(history);
            slot.lent = None;
            return;
        }
        // Called off (the thread was written, replaced or deleted by
        // someone else): what the run added joins what the thread is now.
        let from = self.loan.from.min(history.len());
        if from == history.len() {
            return;
        }
        let new = match Arc::try_unwrap(history) {
            Ok(mut history) => history.split_off(from),
            Err(shared) => shared[from..].to_vec(),
        };
        self.threads
            .entry(self.thread_id.clone())
            .or_default()
            .write(|own| own.extend(new));
    }
}

impl Drop for Lease {
    /// A borrower gone without giving the history back (its task dropped):
    /// the thread keeps the rounds it showed.
    fn drop(&mut self) {
        if !self.given_back
            && let Some(mut slot) = self.slot()
        {
            slot.lent = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use rein_runtime_contract::lifecycle::ToolCallStatus;
    use rein_runtime_contract::message::ToolCall;

    use super::*;

    fn every_kind_of_message() -> Vec<Message> {
        let call = ToolCall::new(
            "call-1",
            "write_file",
            serde_json::json!({"z": 1, "a": [1.5, null, "ü"], "m": {"k": -3}}),
        );
        let mut cut = Message::assistant("half an answ");
        cut.interrupted = true;
        let mut result = Message::tool("call-1", "error: cancelled");
        result.tool_status = Some(ToolCallStatus::MayHaveCompleted);
        vec![
            Message::user("write it — «quoted» \"text\"\n"),
            Message::assistant_with_tools("", vec![call]),
            result,
            cut,
            Message::system("a note"),
        ]
    }

    #[tokio::test]
    async fn a_history_reads_back_exactly_as_it_was_appended() {
        let store = InMemoryThreadStore::new();
        let messages = every_kind_of_message();
        store.append("t", &messages[..2]).await.unwrap();
        store.append("t", &messages[2..]).await.unwrap();
        let loaded = store.load("t").await.unwrap();
        assert_eq!(loaded, messages);
        // Argument keys keep their order.
        let keys: Vec<&String> = loaded[1].tool_calls[0]
            .arguments
            .as_object()
            .unwrap()
            .keys()
            .collect();
        assert_eq!(keys, ["z", "a", "m"]);
    }

    #[tokio::test]
    async fn messages_handed_over_join_the_history_after_what_it_held() {
        let store = InMemoryThreadStore::new();
        let messages = every_kind_of_message();
        store
            .append_owned("t", messages[..2].to_vec())
            .await
            .unwrap();
        store
            .append_owned("t", messages[2..].to_vec())
            .await
            .unwrap();
        store.append_owned("t", Vec::new()).await.unwrap();
        assert_eq!(store.load("t").await.unwrap(), messages);
        store.delete("t").await.unwrap();
        store.append("t", &messages[..1]).await.unwrap();
        store
            .append_owned("t", messages[1..].to_vec())
            .await
            .unwrap();
        assert_eq!(store.load("t").await.unwrap(), messages);
    }

    #[tokio::test]
    async fn a_replaced_history_is_the_new_one_and_a_deleted_thread_is_empty() {
        let store = InMemoryThreadStore::new();
        let messages = every_kind_of_message();
        store.append("t", &messages).await.unwrap();
        store.replace("t", &messages[3..]).await.unwrap();
        assert_eq!(store.load("t").await.unwrap(), messages[3..]);
        store.delete("t").await.unwrap();
        assert!(store.load("t").await.unwrap().is_empty());
        assert!(store.thread_ids().is_empty());
    }

    /// Lends thread "t" of `store`, which must hold a history.
    fn borrow(store: &InMemoryThreadStore) -> BorrowedHistory {
        store.lend("t").expect("a thread with a history is lent")
    }

    #[tokio::test]
    async fn a_lent_history_is_the_store_s_own_vector_and_comes_back_without_a_copy() {
        let store = InMemoryThreadStore::new();
        let messages = every_kind_of_message();
        store.append("t", &messages[..2]).await.unwrap();
        let (mut history, lease) = borrow(&store);
        lease.edit(&mut history, &mut |h| h.push(messages[2].clone()));
        // A round in progress is not shown; a finished one is.
        assert_eq!(store.load("t").await.unwrap(), messages[..2]);
        lease.show(3);
        assert_eq!(store.load("t").await.unwrap(), messages[..3]);
        let vector = Arc::as_ptr(&history);
        lease.edit(&mut history, &mut |h| h.extend_from_slice(&messages[3..]));
        assert_eq!(Arc::as_ptr(&history), vector, "an edit copied the history");
        lease.give_back(history);
        assert_eq!(store.load("t").await.unwrap(), messages);
        // The next run borrows the very vector the last one gave back.
        let (again, _lease) = borrow(&store);
        assert_eq!(Arc::as_ptr(&again), vector);
    }

    #[tokio::test]
    async fn a_new_thread_or_one_lent_already_is_not_lent() {
        let store = InMemoryThreadStore::new();
        assert!(store.lend("t").is_none());
        store.append("t", &every_kind_of_message()).await.unwrap();
        let (_history, _lease) = borrow(&store);
        assert!(store.lend("t").is_none());
    }

    #[tokio::test]
    async fn a_write_from_elsewhere_calls_the_loan_off_and_the_run_s_messages_follow_it() {
        let store = InMemoryThreadStore::new();
        let messages = every_kind_of_message();
        store.append("t", &messages[..1]).await.unwrap();
        let (mut history, lease) = borrow(&store);
        lease.edit(&mut history, &mut |h| h.push(messages[1].clone()));
        lease.show(2);
        store.append("t", &messages[2..3]).await.unwrap();
        // The thread is what it held when lent, then the write.
        assert_eq!(
            store.load("t").await.unwrap(),
            [messages[0].clone(), messages[2].clone()]
        );
        // An edit after the loan is off changes the run's copy only.
        lease.edit(&mut history, &mut |h| h.push(messages[3].clone()));
        assert_eq!(store.load("t").await.unwrap().len(), 2);
        lease.give_back(history);
        assert_eq!(
            store.load("t").await.unwrap(),
            [&messages[0], &messages[2], &messages[1], &messages[3]].map(Clone::clone)
        );
    }

    #[tokio::test]
    async fn a_run_s_messages_join_a_thread_replaced_or_deleted_while_it_ran() {
        let store = InMemoryThreadStore::new();
        let messages = every_kind_of_message();
        store.append("t", &messages[..1]).await.unwrap();
        let (mut history, lease) = borrow(&store);
        lease.edit(&mut history, &mut |h| h.push(messages[1].clone()));
        store.replace("t", &messages[4..]).await.unwrap();
        lease.give_back(history);
        assert_eq!(
            store.load("t").await.unwrap(),
            [messages[4].clone(), messages[1].clone()]
        );
        let (mut history, lease) = borrow(&store);
        lease.edit(&mut history, &mut |h| h.push(messages[2].clone()));
        store.delete("t").await.unwrap();
        lease.give_back(history);
        assert_eq!(store.load("t").await.unwrap(), messages[2..3]);
    }

    #[tokio::test]
    async fn a_borrower_gone_without_giving_back_leaves_the_rounds_it_showed() {
        let store = InMemoryThreadStore::new();
        let messages = every_kind_of_message();
        store.append("t", &messages[..1]).await.unwrap();
        let (mut history, lease) = borrow(&store);
        lease.edit(&mut history, &mut |h| h.extend_from_slice(&messages[1..3]));
        lease.show(3);
        lease.edit(&mut history, &mut |h| h.push(messages[3].clone()));
        drop(lease);
        drop(history);
        assert_eq!(store.load("t").await.unwrap(), messages[..3]);
        // The unfinished round is cut off: the next writer follows the rounds
        // shown.
        store.append("t", &messages[4..]).await.unwrap();
        assert_eq!(
            store.load("t").await.unwrap(),
            [&messages[0], &messages[1], &messages[2], &messages[4]].map(Clone::clone)
        );
        let (history, _lease) = borrow(&store);
        assert_eq!(history.len(), 4);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_first_writes_to_a_new_thread_lose_nothing() {
        for round in 0..500 {
            let store = InMemoryThreadStore::new();
            let writers: Vec<_> = (0..4)
                .map(|k| {
                    let store = store.clone();
                    tokio::spawn(async move {
                        let message = Message::user(format!("w{k}"));
                        if k % 2 == 0 {
                            store.append_owned("t", vec![message]).await
                        } else {
                            store.append("t", &[message]).await
                        }
                    })
                })
                .collect();
            for writer in writers {
                writer.await.unwrap().unwrap();
            }
            assert_eq!(store.load("t").await.unwrap().len(), 4, "round {round}");
        }
    }
}
