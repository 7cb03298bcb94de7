//! Riding out a database restart: which errors pass ([`is_transient`]),
//! and retrying an operation until it succeeds or fails for good
//! ([`retry`]).

/// Whether a database error is the kind that passes (the connection was
/// lost, the server is restarting), so the operation is worth retrying.
pub fn is_transient(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::Protocol(_)
        | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(e) => e.code().is_some_and(|code| {
            // connection exceptions, admin shutdown, cannot connect now
            code.starts_with("08") || code == "57P01" || code == "57P02" || code == "57P03"
        }),
        _ => false,
    }
}

/// Runs `op` until it succeeds, fails for good, or `within` has passed
/// while the database is unreachable (see [`is_transient`]), backing off
/// between attempts.
///
/// # Errors
///
/// The last error.
///
/// # Cancel safety
///
/// As `op`'s: dropping it drops the attempt under way.
pub async fn retry<T, F, Fut>(within: std::time::Duration, mut op: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    let start = tokio::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(50);
    loop {
        match op().await {
            Err(e) if is_transient(&e) && start.elapsed() < within => {
                tracing::warn!(error = %e, "the database is unreachable; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(1));
            }
            other => return other,
        }
    }
}
