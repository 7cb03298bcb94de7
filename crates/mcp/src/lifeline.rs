//! The lifeline: no process Rein started outlives it, even when Rein is
//! killed with `kill -9`.
//!
//! A stdio server runs in its own process group, and its children stay in
//! that group. When Rein ends normally it kills the group itself. When Rein
//! is killed, the server sees its stdin end and exits, but a child of the
//! server would be orphaned — nothing of Rein is left to kill it.
//!
//! So beside each server Rein starts a tiny watchdog (`sh`, in a group of
//! its own so a terminal's Ctrl-C does not reach it) whose stdin is a pipe
//! only Rein holds open. The pipe's end — Rein dropping the connection, or
//! the kernel closing Rein's descriptors when it dies, however it dies —
//! is the watchdog's signal: it sends the server's group `SIGTERM`, gives
//! it two seconds, then `SIGKILL`, and exits. No `unsafe`, no polling from
//! Rein, and nothing to configure.

use std::process::Stdio;

use tokio::process::{Child, Command};

/// The watchdog's script: wait for the end of stdin, then end the group
/// `$1` (`TERM`, up to two seconds for it to go, `KILL`). Written for any
/// POSIX `sh` (dash's `kill` takes no `--`: `-$1` after the signal is the
/// group).
const SCRIPT: &str = r#"read -r _line
kill -TERM "-$1" 2>/dev/null || exit 0
for _ in 1 2 3 4 5 6 7 8 9 10; do
  kill -0 "-$1" 2>/dev/null || exit 0
  sleep 0.2
done
kill -KILL "-$1" 2>/dev/null
exit 0"#;

/// A running watchdog for one process group; dropping it cuts the line
/// (the watchdog then ends the group and exits).
#[derive(Debug)]
pub(crate) struct Lifeline {
    _watchdog: Child,
}

impl Lifeline {
    /// Starts the watchdog of process group `group`.
    pub(crate) fn start(group: u32) -> std::io::Result<Self> {
        let watchdog = Command::new("sh")
            .args(["-c", SCRIPT, "rein-mcp-lifeline", &group.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(false)
            .spawn()?;
        Ok(Self {
            _watchdog: watchdog,
        })
    }
}
