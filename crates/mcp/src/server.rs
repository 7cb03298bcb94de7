//! [`McpServer`]: one connection to an MCP server, restarted when it dies,
//! shut down (or killed with its process group) when Rein is done with it.
//!
//! **Invariant:** a stdio server's child process is owned by the server's
//! state from spawn to exit: shutdown waits for it and then kills its
//! process group; a dead connection kills it; dropping the `McpServer`
//! kills it. No path leaves it running — and if Rein itself is killed,
//! the [lifeline](crate::lifeline) ends the group.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use process_wrap::tokio::{ChildWrapper, CommandWrap, ProcessGroup};
use rein_runtime_contract::lifecycle::ToolCallStatus;
use rein_runtime_contract::tool::{Tool, ToolDescriptor, ToolError, ToolOutput};
use rmcp::model::{CallToolRequestParams, CallToolResponse};
use rmcp::service::{Peer, RunningService, ServiceExt};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceError};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lifeline::Lifeline;
use crate::stdout::{Stdout, TOO_LARGE_CODE};
use crate::tool::McpTool;
use crate::{McpError, McpOptions, McpTransport, content, rein_name};

/// One MCP server. See the [crate docs](crate) for its run control.
pub struct McpServer {
    id: String,
    transport: McpTransport,
    options: McpOptions,
    /// The tools listed at start.
    listed: Vec<Listed>,
    state: tokio::sync::Mutex<State>,
    generations: AtomicU64,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("id", &self.id)
            .field(
                "tools",
                &self.listed.iter().map(|t| &t.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

enum State {
    Up(Box<Connection>),
    /// Dead or failed to start: the next use starts it again, not before
    /// `retry_at`.
    Down {
        failures: u32,
        retry_at: Instant,
        reason: String,
    },
    Closed,
}

/// One tool the server listed at start.
#[derive(Debug, Clone, Default)]
struct Listed {
    name: String,
    description: String,
    schema: Value,
    /// Its `readOnlyHint` annotation.
    read_only: bool,
}

struct Connection {
    generation: u64,
    client: RunningService<RoleClient, ()>,
    child: Option<Box<dyn ChildWrapper>>,
    /// Ends the child's process group if Rein dies without doing it.
    _lifeline: Option<Lifeline>,
    /// Cancelled when a stdio server's stdout ends (it exited): calls in
    /// flight end at once instead of when the SDK notices.
    closed: CancellationToken,
}

impl McpServer {
    /// Starts the server (spawns it or connects to it), completes the MCP
    /// handshake and lists its tools.
    ///
    /// # Errors
    ///
    /// [`McpError::Start`] or [`McpError::ListTools`], naming the server.
    pub async fn start(
        id: impl Into<String>,
        transport: McpTransport,
        options: McpOptions,
    ) -> Result<Arc<Self>, McpError> {
        let mut server = Self {
            id: id.into(),
            transport,
            options,
            listed: Vec::new(),
            state: tokio::sync::Mutex::new(State::Closed),
            generations: AtomicU64::new(0),
        };
        let mut connection = server.connect().await.map_err(|reason| McpError::Start {
            server: server.id.clone(),
            reason,
        })?;
        let listed =
            tokio::time::timeout(options.start_timeout, connection.client.list_all_tools())
                .await
                .map_err(|_| format!("no answer within {} s", options.start_timeout.as_secs()))
                .and_then(|r| r.map_err(|e| e.to_string()));
        let tools = match listed {
            Ok(tools) => tools,
            Err(reason) => {
                connection.kill();
                return Err(McpError::ListTools {
                    server: server.id.clone(),
                    reason,
                });
            }
        };
        server.listed = tools
            .iter()
            .filter_map(|tool| {
                let json = serde_json::to_value(tool).ok()?;
                let name = json.get("name")?.as_str()?.to_owned();
                let description = json
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                let schema = json
                    .get("inputSchema")
                    .cloned()
                    .unwrap_or_else(|| serde_json::json!({"type": "object"}));
                // The server's hint that the tool changes nothing.
                let read_only = json
                    .pointer("/annotations/readOnlyHint")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                Some(Listed {
                    name,
                    description,
                    schema,
                    read_only,
                })
            })
            .collect();
        server.state = tokio::sync::Mutex::new(State::Up(Box::new(connection)));
        Ok(Arc::new(server))
    }

    /// The server's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The names of the server's tools, as the server names them.
    pub fn tool_names(&self) -> Vec<&str> {
        self.listed.iter().map(|t| t.name.as_str()).collect()
    }

    /// Every tool of the server as a Rein tool named `<server>__<tool>`.
    pub fn tools(self: &Arc<Self>) -> Vec<Arc<dyn Tool>> {
        self.listed
            .iter()
            .map(|t| self.make_tool(&t.name))
            .collect()
    }

    /// One tool by its name on the server.
    ///
    /// # Errors
    ///
    /// [`McpError::UnknownTool`] listing the server's tools.
    pub fn tool(self: &Arc<Self>, name: &str) -> Result<Arc<dyn Tool>, McpError> {
        if self.listed.iter().any(|t| t.name == name) {
            Ok(self.make_tool(name))
        } else {
            Err(McpError::UnknownTool {
                server: self.id.clone(),
                tool: name.to_owned(),
                known: self.tool_names().join(", "),
            })
        }
    }

    fn make_tool(self: &Arc<Self>, name: &str) -> Arc<dyn Tool> {
        let listed = self
            .listed
            .iter()
            .find(|t| t.name == name)
            .cloned()
            .unwrap_or_default();
        let descriptor = ToolDescriptor::new(rein_name(&self.id, name), listed.description)
            .with_parameters(listed.schema);
        Arc::new(McpTool::new(
            self.clone(),
            name.to_owned(),
            descriptor,
            listed.read_only,
        ))
    }

    /// The process id of a stdio server's current child (its process
    /// group's id), while it runs.
    pub async fn child_pid(&self) -> Option<u32> {
        match &*self.state.lock().await {
            State::Up(c) => c.child.as_ref().and_then(|child| child.id()),
            _ => None,
        }
    }

    /// Closes the connection: a stdio server's stdin is closed and it gets
    /// [`McpOptions::cancel_wait`] to exit, then its process group is
    /// killed. Later calls get errored results.
    ///
    /// # Cancel safety
    ///
    /// Dropped midway, the child is killed when the `McpServer` is dropped.
    pub async fn shutdown(&self) {
        let previous = std::mem::replace(&mut *self.state.lock().await, State::Closed);
        let State::Up(connection) = previous else {
            return;
        };
        let Connection {
            client, mut child, ..
        } = *connection;
        // Ends the client's task; its transport (the child's stdin) closes.
        let _ = client.cancel().await;
        if let Some(child) = child.as_mut() {
            let exited = tokio::time::timeout(self.options.cancel_wait, child.wait()).await;
            if exited.is_err() {
                tracing::warn!(server = %self.id, "MCP server did not exit within the cancel-wait bound; killing its process group");
            }
            // Kills what is left of the group (a server's own children too).
            let _ = Box::into_pin(child.kill()).await;
        }
    }

    /// Spawns or connects, and completes the handshake.
    async fn connect(&self) -> Result<Connection, String> {
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let timeout = self.options.start_timeout;
        let too_slow = || format!("no MCP handshake within {} s", timeout.as_secs());
        match &self.transport {
            McpTransport::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let mut wrap = CommandWrap::with_new(command, |c| {
                    c.args(args)
                        .envs(env)
                        .stdin(std::process::Stdio::piped())
                        .stdout(std::process::Stdio::piped())
                        .stderr(std::process::Stdio::piped());
                    if let Some(dir) = cwd {
                        c.current_dir(dir);
                    }
                });
                wrap.wrap(ProcessGroup::leader());
                let mut child = wrap
                    .spawn()
                    .map_err(|e| format!("cannot run `{command}`: {e}"))?;
                let lifeline = child.id().and_then(|group| match Lifeline::start(group) {
                    Ok(lifeline) => Some(lifeline),
                    Err(e) => {
                        tracing::warn!(server = %self.id, "no lifeline for the MCP server (`sh` failed: {e}); if Rein is killed, its children may outlive it");
                        None
                    }
                });
                let (Some(stdout), Some(stdin)) = (child.stdout().take(), child.stdin().take())
                else {
                    let _ = child.start_kill();
                    return Err("the child's stdio could not be taken".to_owned());
                };
                if let Some(stderr) = child.stderr().take() {
                    let id = self.id.clone();
                    tokio::spawn(async move {
                        let mut lines = BufReader::new(stderr).lines();
                        while let Ok(Some(line)) = lines.next_line().await {
                            tracing::debug!(server = %id, "{line}");
                        }
                    });
                }
                let closed = CancellationToken::new();
                let stdout = Stdout::new(
                    stdout,
                    closed.clone(),
                    &self.id,
                    self.options.max_result_bytes,
                );
                match tokio::time::timeout(timeout, ().serve((stdout, stdin))).await {
                    Ok(Ok(client)) => Ok(Connection {
                        generation,
                        client,
                        child: Some(child),
                        _lifeline: lifeline,
                        closed,
                    }),
                    Ok(Err(e)) => {
                        let _ = child.start_kill();
                        Err(format!("the MCP handshake failed: {e}"))
                    }
                    Err(_) => {
                        let _ = child.start_kill();
                        Err(too_slow())
                    }
                }
            }
            McpTransport::Http { url } => {
                let transport = StreamableHttpClientTransport::from_uri(url.as_str());
                match tokio::time::timeout(timeout, ().serve(transport)).await {
                    Ok(Ok(client)) => Ok(Connection {
                        generation,
                        client,
                        child: None,
                        _lifeline: None,
                        closed: CancellationToken::new(),
                    }),
                    Ok(Err(e)) => Err(format!("the MCP handshake with {url} failed: {e}")),
                    Err(_) => Err(too_slow()),
                }
            }
        }
    }

    /// A peer to send a call to, starting the server again if it died
    /// (and its backoff has passed).
    async fn peer(&self) -> Result<(u64, Peer<RoleClient>, CancellationToken), String> {
        let mut state = self.state.lock().await;
        if let State::Up(c) = &*state
            && (c.client.is_closed() || c.closed.is_cancelled())
        {
            state.mark_down("it exited".to_owned());
        }
        match &*state {
            State::Up(c) => return Ok((c.generation, c.client.peer().clone(), c.closed.clone())),
            State::Closed => return Err(format!("MCP server \"{}\" has been shut down", self.id)),
            State::Down {
                retry_at, reason, ..
            } if Instant::now() < *retry_at => {
                let wait = retry_at.saturating_duration_since(Instant::now());
                return Err(format!(
                    "MCP server \"{}\" is down ({reason}); the next restart is in {} ms",
                    self.id,
                    wait.as_millis()
                ));
            }
            State::Down { .. } => {}
        }
        let failures = match &*state {
            State::Down { failures, .. } => *failures,
            _ => 0,
        };
        tracing::info!(server = %self.id, "restarting the MCP server");
        match self.connect().await {
            Ok(connection) => {
                let peer = (
                    connection.generation,
                    connection.client.peer().clone(),
                    connection.closed.clone(),
                );
                *state = State::Up(Box::new(connection));
                Ok(peer)
            }
            Err(reason) => {
                let backoff = self
                    .options
                    .restart_backoff
                    .saturating_mul(2u32.saturating_pow(failures))
                    .min(self.options.restart_backoff_cap);
                let message = format!(
                    "MCP server \"{}\" could not be restarted: {reason}",
                    self.id
                );
                *state = State::Down {
                    failures: failures.saturating_add(1),
                    retry_at: Instant::now() + backoff,
                    reason,
                };
                Err(message)
            }
        }
    }

    /// Marks the connection of `generation` dead (if it is still the
    /// current one) and kills its child.
    async fn lost(&self, generation: u64, reason: String) {
        let mut state = self.state.lock().await;
        if matches!(&*state, State::Up(c) if c.generation == generation) {
            state.mark_down(reason);
        }
    }

    /// Calls one of the server's tools. Dropping the future sends the
    /// server `notifications/cancelled` for the request. A failure whose
    /// outcome is uncertain (no answer in time, the server exited, a
    /// result too large) carries the status `read_only` implies, or
    /// `may_have_completed` for a result that came back too large.
    pub(crate) async fn call(
        &self,
        tool: &str,
        args: Value,
        read_only: bool,
    ) -> Result<ToolOutput, ToolError> {
        let uncertain = if read_only {
            ToolCallStatus::Interrupted
        } else {
            ToolCallStatus::MayHaveCompleted
        };
        let (generation, peer, closed) = self.peer().await.map_err(ToolError::new)?;
        let mut params = CallToolRequestParams::new(tool.to_owned());
        match args {
            Value::Object(map) => params = params.with_arguments(map),
            Value::Null => {}
            other => {
                return Err(ToolError::new(format!(
                    "the arguments of MCP tool \"{tool}\" must be a JSON object, not {other}"
                )));
            }
        }
        let limit = self.options.tool_timeout;
        let answer = tokio::select! {
            answer = tokio::time::timeout(limit, peer.call_tool_once(params)) => answer,
            _ = closed.cancelled() => {
                self.lost(generation, "it exited".to_owned()).await;
                return Err(ToolError::new(format!(
                    "MCP server \"{}\" exited during tool \"{tool}\"; the server restarts on next use",
                    self.id
                )).with_status(uncertain));
            }
        };
        match answer {
            // The call's future was dropped: the server was told.
            Err(_) => Err(ToolError::new(format!(
                "MCP server \"{}\" did not answer tool \"{tool}\" within {} s; the call was cancelled",
                self.id,
                limit.as_secs_f64()
            ))
            .with_status(uncertain)),
            Ok(Err(ServiceError::McpError(e))) if e.code.0 == TOO_LARGE_CODE => {
                Err(ToolError::new(format!(
                    "MCP server \"{}\" answered tool \"{tool}\" with a {}; it was discarded unread",
                    self.id, e.message
                ))
                .with_status(ToolCallStatus::MayHaveCompleted))
            }
            Ok(Err(e)) => {
                if matches!(
                    e,
                    ServiceError::TransportClosed | ServiceError::TransportSend(_)
                ) {
                    self.lost(generation, format!("its connection closed: {e}"))
                        .await;
                }
                Err(ToolError::new(format!(
                    "MCP server \"{}\" failed during tool \"{tool}\": {e}",
                    self.id
                )))
            }
            Ok(Ok(CallToolResponse::Complete(result))) => {
                let json = serde_json::to_value(&result).map_err(|e| {
                    ToolError::new(format!(
                        "MCP server \"{}\" sent an unreadable result: {e}",
                        self.id
                    ))
                })?;
                let output = content::to_output(&json)?;
                let bytes = output.to_content().len();
                if bytes > self.options.max_result_bytes {
                    return Err(ToolError::new(format!(
                        "MCP server \"{}\" answered tool \"{tool}\" with a result too large ({bytes} bytes; the limit is {} bytes); it was discarded unread",
                        self.id, self.options.max_result_bytes
                    ))
                    .with_status(ToolCallStatus::MayHaveCompleted));
                }
                Ok(output)
            }
            Ok(Ok(_)) => Err(ToolError::new(format!(
                "MCP server \"{}\" asked for more input or started a task for tool \"{tool}\", which Rein does not support",
                self.id
            ))),
        }
    }
}

impl State {
    /// A live connection becomes dead (its child killed); the next use
    /// restarts it at once.
    fn mark_down(&mut self, reason: String) {
        let down = State::Down {
            failures: 0,
            retry_at: Instant::now(),
            reason,
        };
        if let State::Up(mut dead) = std::mem::replace(self, down) {
            dead.kill();
        }
    }
}

impl Connection {
    /// Kills a stdio server's process group at once.
    fn kill(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        if let Ok(mut state) = self.state.try_lock()
            && let State::Up(connection) = &mut *state
        {
            connection.kill();
        }
    }
}
