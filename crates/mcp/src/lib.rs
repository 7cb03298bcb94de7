//! Tools from MCP servers, with run control across the boundary.
//!
//! # The model
//!
//! An [`McpServer`] is one connection to an MCP server: a child process
//! spoken to over stdio ([`McpTransport::Stdio`]) or a streamable-HTTP
//! endpoint ([`McpTransport::Http`]), through the official Rust SDK
//! (`rmcp`). [`McpServer::start`] connects and lists the server's tools;
//! [`McpServer::tools`] gives each one as a Rein [`Tool`] named
//! `<server id>__<tool>`, with the server's description and input schema.
//!
//! Run control reaches the server:
//!
//! - **Cancellation.** A call's future is dropped when its run is cancelled
//!   (or its deadline passes); dropping it sends the server
//!   `notifications/cancelled` for the request, and the call ends at once.
//! - **Timeouts.** A call that gets no answer within
//!   [`McpOptions::tool_timeout`] is cancelled the same way and becomes an
//!   errored result; the run goes on.
//! - **Crashes.** A stdio server that exits fails its calls in flight with
//!   errored results naming the server; it is restarted on its next use,
//!   after a backoff that doubles with each failed start.
//! - **Shutdown.** [`McpServer::shutdown`] closes the server's stdin, gives
//!   it [`McpOptions::cancel_wait`] to exit, then kills its whole process
//!   group. Dropping an `McpServer` kills the group at once: no child
//!   process outlives it. A watchdog beside each stdio server ends the
//!   group when Rein dies, even by `kill -9`, so the server's own children
//!   are not orphaned either.
//!
//! - **Size.** A stdio server's message over
//!   [`McpOptions::max_result_bytes`] is never held whole: a result over
//!   it answers its call at once with "result too large (N bytes …)",
//!   recorded `may_have_completed` (the tool ran).
//!
//! Results: text content is the tool's output; structured content comes
//! with it as JSON; other content (images, audio, resources) is described
//! in text, not dropped; an MCP error result (`isError`) is an errored
//! tool result the model sees.

mod content;
mod lifeline;
mod server;
mod stdout;
mod tool;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

pub use server::McpServer;
pub use tool::McpTool;

#[doc(no_inline)]
pub use rein_runtime_contract::tool::Tool;

/// The separator of a tool's Rein name: `<server id>__<tool>`.
pub const SEPARATOR: &str = "__";

/// How to reach an MCP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpTransport {
    /// A child process spoken to over stdin/stdout, in its own process group.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Environment variables added to Rein's.
        env: BTreeMap<String, String>,
        /// Its working directory (default: Rein's).
        cwd: Option<PathBuf>,
    },
    /// A streamable-HTTP endpoint, e.g. `http://127.0.0.1:3001/mcp`.
    Http {
        /// The endpoint's URL.
        url: String,
    },
}

/// Time limits of a server's calls, restarts and shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct McpOptions {
    /// How long a tool call may wait for its answer (default 60 s).
    pub tool_timeout: Duration,
    /// How long starting the server and listing its tools may take
    /// (default 30 s).
    pub start_timeout: Duration,
    /// How long a stdio server gets to exit at shutdown before its process
    /// group is killed (default 5 s, the runtime's cancel-wait bound).
    pub cancel_wait: Duration,
    /// The first wait before restarting a server that died; it doubles
    /// with each failed start (default 500 ms).
    pub restart_backoff: Duration,
    /// The longest wait between restarts (default 30 s).
    pub restart_backoff_cap: Duration,
    /// The largest message a stdio server may send, in bytes (default
    /// 1 MiB). A tool result over it is discarded unread and answered at
    /// once as "result too large (N bytes …)", recorded
    /// `may_have_completed`: one result never holds more memory than this.
    pub max_result_bytes: usize,
}

impl Default for McpOptions {
    fn default() -> Self {
        Self {
            tool_timeout: Duration::from_secs(60),
            start_timeout: Duration::from_secs(30),
            cancel_wait: Duration::from_secs(5),
            restart_backoff: Duration::from_millis(500),
            restart_backoff_cap: Duration::from_secs(30),
            max_result_bytes: 1024 * 1024,
        }
    }
}

/// Why a server could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The server could not be started or did not complete the MCP
    /// handshake.
    #[error("MCP server \"{server}\" could not be started: {reason}")]
    Start {
        /// The server id.
        server: String,
        /// What went wrong.
        reason: String,
    },
    /// Listing the server's tools failed.
    #[error("MCP server \"{server}\" did not list its tools: {reason}")]
    ListTools {
        /// The server id.
        server: String,
        /// What went wrong.
        reason: String,
    },
    /// A tool asked for by name does not exist on the server.
    #[error("MCP server \"{server}\" has no tool \"{tool}\"; its tools: {known}")]
    UnknownTool {
        /// The server id.
        server: String,
        /// The tool.
        tool: String,
        /// The server's tools.
        known: String,
    },
}

/// The Rein name of a server's tool: `<server>__<tool>`, with every
/// character providers refuse in function names (anything but letters,
/// digits, `_` and `-`) replaced by `_`.
pub fn rein_name(server: &str, tool: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    format!("{}{SEPARATOR}{}", clean(server), clean(tool))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_keep_what_providers_accept_and_replace_the_rest() {
        assert_eq!(rein_name("everything", "get-sum"), "everything__get-sum");
        assert_eq!(rein_name("fs", "read.file/v2"), "fs__read_file_v2");
    }
}

/// The MCP guide's code, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/mcp.md")]
mod mcp_doc {}
