//! Where thread histories live between runs.
//!
//! A run loads its thread's history when it starts, appends its input at
//! once, appends each finished round, and appends the repaired tail when it
//! ends. A store that says it does not want each round
//! ([`ThreadStore::stores_each_round`], the in-memory store) gets a run's
//! messages once, moved in when the run ends (or parks). Only the run
//! holding a thread's slot writes to that thread, so a store needs no
//! cross-run coordination.

use std::sync::Arc;

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

/// A [`ThreadStore`] in process memory; histories are lost when it is dropped.
///
/// A run's messages join its thread when the run ends (or parks), moved in
/// rather than copied ([`ThreadStore::stores_each_round`] is `false`): a
/// live run's history is held once, by the run. Until then, reading the
/// thread shows it as it was when the run started.
#[derive(Debug, Default, Clone)]
pub struct InMemoryThreadStore {
    threads: Arc<DashMap<String, Vec<Message>>>,
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
}

#[async_trait::async_trait]
impl ThreadStore for InMemoryThreadStore {
    async fn load(&self, thread_id: &str) -> Result<Vec<Message>, ThreadStoreError> {
        Ok(self
            .threads
            .get(thread_id)
            .map(|h| h.value().clone())
            .unwrap_or_default())
    }

    async fn append(&self, thread_id: &str, messages: &[Message]) -> Result<(), ThreadStoreError> {
        if messages.is_empty() {
            return Ok(());
        }
        // A thread being appended to usually exists: no key copied then.
        if let Some(mut history) = self.threads.get_mut(thread_id) {
            history.extend_from_slice(messages);
            return Ok(());
        }
        self.threads
            .entry(thread_id.to_owned())
            .or_default()
            .extend_from_slice(messages);
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
        if let Some(mut history) = self.threads.get_mut(thread_id) {
            if history.is_empty() {
                messages.shrink_to_fit();
                *history = messages;
            } else {
                history.append(&mut messages);
            }
            return Ok(());
        }
        // A new thread keeps the run's own vector (its spare room given back).
        messages.shrink_to_fit();
        self.threads.insert(thread_id.to_owned(), messages);
        Ok(())
    }

    fn stores_each_round(&self) -> bool {
        false
    }

    async fn replace(&self, thread_id: &str, messages: &[Message]) -> Result<(), ThreadStoreError> {
        self.threads.insert(thread_id.to_owned(), messages.to_vec());
        Ok(())
    }

    async fn delete(&self, thread_id: &str) -> Result<(), ThreadStoreError> {
        self.threads.remove(thread_id);
        Ok(())
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
}
