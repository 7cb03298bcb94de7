//! Where offloaded tool results live: trait [`ArtifactStore`], kept in
//! memory ([`InMemoryArtifactStore`], the default) or as files
//! ([`DirArtifactStore`]).
//!
//! An artifact belongs to a thread and is named by an id unique within it
//! (the runtime uses the id of the tool call whose result it holds, with a
//! `~<hash of the text>` suffix when a provider reused that id for another
//! result),
//! so a model can read only its own thread's artifacts.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// A failure of an artifact store; the message says what and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ArtifactError(pub String);

/// Keeps the full text of offloaded tool results.
///
/// `put` of an id that exists replaces it (the runtime only ever puts the
/// same text again). Stores must be cheap to call from a run's task.
#[async_trait::async_trait]
pub trait ArtifactStore: Send + Sync {
    /// Stores `text` as artifact `id` of `thread_id`.
    async fn put(&self, thread_id: &str, id: &str, text: &str) -> Result<(), ArtifactError>;

    /// The artifact, or `None` if the thread has no artifact `id`.
    async fn get(&self, thread_id: &str, id: &str) -> Result<Option<String>, ArtifactError>;

    /// Drops every artifact of the thread (the thread was deleted).
    async fn delete_thread(&self, thread_id: &str) -> Result<(), ArtifactError>;
}

/// Artifacts in this process's memory (lost with it).
#[derive(Debug, Default)]
pub struct InMemoryArtifactStore {
    threads: Mutex<HashMap<String, HashMap<String, String>>>,
}

impl InMemoryArtifactStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait::async_trait]
impl ArtifactStore for InMemoryArtifactStore {
    async fn put(&self, thread_id: &str, id: &str, text: &str) -> Result<(), ArtifactError> {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        let thread = threads.entry(thread_id.to_owned()).or_default();
        if thread.get(id).is_none_or(|t| t != text) {
            thread.insert(id.to_owned(), text.to_owned());
        }
        Ok(())
    }

    async fn get(&self, thread_id: &str, id: &str) -> Result<Option<String>, ArtifactError> {
        let threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        Ok(threads.get(thread_id).and_then(|t| t.get(id)).cloned())
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<(), ArtifactError> {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        threads.remove(thread_id);
        Ok(())
    }
}

/// Artifacts as files: `<dir>/<thread>/<id>.txt`, names hex-encoded where
/// they hold anything but letters, digits, `-` and `_`, or start with `x`
/// (the mark of an encoded name, so no two names share a file).
#[derive(Debug, Clone)]
pub struct DirArtifactStore {
    dir: PathBuf,
}

impl DirArtifactStore {
    /// A store under `dir` (created when the first artifact is written).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    fn thread_dir(&self, thread_id: &str) -> PathBuf {
        self.dir.join(file_name(thread_id))
    }
}

/// `name` as a file name: kept if it is plain, else `x` + hex. A plain
/// name never starts with `x`, so an encoded name and a plain one cannot
/// be the same.
fn file_name(name: &str) -> String {
    let plain = !name.is_empty()
        && !name.starts_with('x')
        && name.len() <= 100
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if plain {
        name.to_owned()
    } else {
        let mut hex = String::with_capacity(1 + name.len() * 2);
        hex.push('x');
        for b in name.bytes() {
            hex.push_str(&format!("{b:02x}"));
        }
        hex
    }
}

fn io_error(what: &str, path: &std::path::Path, e: std::io::Error) -> ArtifactError {
    ArtifactError(format!("could not {what} {}: {e}", path.display()))
}

#[async_trait::async_trait]
impl ArtifactStore for DirArtifactStore {
    async fn put(&self, thread_id: &str, id: &str, text: &str) -> Result<(), ArtifactError> {
        let dir = self.thread_dir(thread_id);
        let path = dir.join(format!("{}.txt", file_name(id)));
        let text = text.to_owned();
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&dir).map_err(|e| io_error("create", &dir, e))?;
            // Written aside and renamed: a reader never sees half a file.
            let partial = path.with_extension("partial");
            std::fs::write(&partial, text).map_err(|e| io_error("write", &partial, e))?;
            std::fs::rename(&partial, &path).map_err(|e| io_error("rename", &partial, e))
        })
        .await
        .map_err(|e| ArtifactError(format!("the artifact write panicked: {e}")))?
    }

    async fn get(&self, thread_id: &str, id: &str) -> Result<Option<String>, ArtifactError> {
        let path = self
            .thread_dir(thread_id)
            .join(format!("{}.txt", file_name(id)));
        match tokio::fs::read_to_string(&path).await {
            Ok(text) => Ok(Some(text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error("read", &path, e)),
        }
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<(), ArtifactError> {
        let dir = self.thread_dir(thread_id);
        match tokio::fs::remove_dir_all(&dir).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error("remove", &dir, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_names_become_hex_and_plain_ones_stay() {
        assert_eq!(file_name("call_1"), "call_1");
        assert_eq!(file_name("../x"), "x2e2e2f78");
        assert_eq!(file_name(""), "x");
        assert_eq!(file_name("x1"), "x7831");
    }

    #[tokio::test]
    async fn a_thread_named_like_another_s_encoding_keeps_its_own_artifacts() {
        let dir = std::env::temp_dir().join(format!("rein-artifacts-x-{}", std::process::id()));
        let store = DirArtifactStore::new(&dir);
        // `a.b` is encoded as `x612e62`, a thread id of its own.
        store.put("a.b", "call_1", "of a.b").await.unwrap();
        assert_eq!(store.get("x612e62", "call_1").await.unwrap(), None);
        store.put("x612e62", "call_1", "of x612e62").await.unwrap();
        store.delete_thread("x612e62").await.unwrap();
        assert_eq!(
            store.get("a.b", "call_1").await.unwrap().as_deref(),
            Some("of a.b")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_directory_store_keeps_threads_apart_and_forgets_a_deleted_one() {
        let dir = std::env::temp_dir().join(format!("rein-artifacts-{}", std::process::id()));
        let store = DirArtifactStore::new(&dir);
        store.put("t/1", "call 1", "one\ntwo").await.unwrap();
        store.put("t2", "call 1", "other").await.unwrap();
        assert_eq!(
            store.get("t/1", "call 1").await.unwrap().as_deref(),
            Some("one\ntwo")
        );
        assert_eq!(
            store.get("t2", "call 1").await.unwrap().as_deref(),
            Some("other")
        );
        assert_eq!(store.get("t/1", "nope").await.unwrap(), None);
        store.delete_thread("t/1").await.unwrap();
        assert_eq!(store.get("t/1", "call 1").await.unwrap(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
