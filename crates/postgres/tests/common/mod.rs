//! What the PostgreSQL suites share.

#![allow(dead_code)]

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// `REIN_DATABASE_URL`, or `None` (the test says it is skipped).
pub(crate) fn url() -> Option<String> {
    match std::env::var("REIN_DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            let _ = std::io::stderr().write_all(
                b"PostgreSQL tests skipped: REIN_DATABASE_URL is not set (run `cargo xtask postgres start`)\n",
            );
            None
        }
    }
}

/// A thread id no other test (or earlier run) uses.
pub(crate) fn thread(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "{name}-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
