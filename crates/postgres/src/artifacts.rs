//! [`PgArtifactStore`]: offloaded tool results in PostgreSQL, so any
//! process that runs a thread can read its artifacts back.

use rein_runtime::context::{ArtifactError, ArtifactStore};
use sqlx::postgres::PgPool;

/// A durable [`ArtifactStore`]: one row of `rein_artifacts` per artifact,
/// keyed by thread and id.
///
/// Writes are not fenced: an artifact is named by the tool call whose
/// result it holds, so a stale owner can only write the text the thread's
/// history already has (or an artifact nobody refers to).
#[derive(Debug, Clone)]
pub struct PgArtifactStore {
    pool: PgPool,
}

impl PgArtifactStore {
    /// A store on `pool` (from [`connect`](crate::connect), which creates
    /// the table).
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

/// An artifact store error naming the operation, thread and artifact.
fn failed(what: &str, thread_id: &str, id: Option<&str>, e: &sqlx::Error) -> ArtifactError {
    let id = id.map_or_else(String::new, |id| format!(" artifact \"{id}\" of"));
    ArtifactError(format!(
        "PostgreSQL artifact store: could not {what}{id} thread \"{thread_id}\": {e}"
    ))
}

#[async_trait::async_trait]
impl ArtifactStore for PgArtifactStore {
    async fn put(&self, thread_id: &str, id: &str, text: &str) -> Result<(), ArtifactError> {
        crate::retry(crate::WRITE_RETRY, || {
            sqlx::query(
                "INSERT INTO rein_artifacts (thread_id, artifact_id, body) VALUES ($1, $2, $3)
                 ON CONFLICT (thread_id, artifact_id) DO UPDATE SET body = EXCLUDED.body
                 WHERE rein_artifacts.body IS DISTINCT FROM EXCLUDED.body",
            )
            .bind(thread_id)
            .bind(id)
            .bind(text.as_bytes())
            .execute(&self.pool)
        })
        .await
        .map(drop)
        .map_err(|e| failed("store", thread_id, Some(id), &e))
    }

    async fn get(&self, thread_id: &str, id: &str) -> Result<Option<String>, ArtifactError> {
        let body: Option<Vec<u8>> = crate::retry(crate::WRITE_RETRY, || {
            sqlx::query_scalar(
                "SELECT body FROM rein_artifacts WHERE thread_id = $1 AND artifact_id = $2",
            )
            .bind(thread_id)
            .bind(id)
            .fetch_optional(&self.pool)
        })
        .await
        .map_err(|e| failed("read", thread_id, Some(id), &e))?;
        body.map(|bytes| {
            String::from_utf8(bytes).map_err(|_| {
                ArtifactError(format!(
                    "PostgreSQL artifact store: artifact \"{id}\" of thread \"{thread_id}\" is not UTF-8 text"
                ))
            })
        })
        .transpose()
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<(), ArtifactError> {
        crate::retry(crate::WRITE_RETRY, || {
            sqlx::query("DELETE FROM rein_artifacts WHERE thread_id = $1")
                .bind(thread_id)
                .execute(&self.pool)
        })
        .await
        .map(drop)
        .map_err(|e| failed("delete the artifacts of", thread_id, None, &e))
    }
}
