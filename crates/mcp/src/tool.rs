//! [`McpTool`]: one tool of an MCP server as a Rein [`Tool`].

use std::sync::Arc;

use rein_runtime_contract::tool::{Tool, ToolContext, ToolDescriptor, ToolError, ToolOutput};

use crate::McpServer;

/// A tool of an [`McpServer`], named `<server>__<tool>`.
///
/// `execute` may be dropped at any await (its run was cancelled): the
/// server is then sent `notifications/cancelled` for the call.
#[derive(Debug)]
pub struct McpTool {
    server: Arc<McpServer>,
    name: String,
    descriptor: ToolDescriptor,
    /// The server's `readOnlyHint` annotation.
    read_only: bool,
}

impl McpTool {
    pub(crate) fn new(
        server: Arc<McpServer>,
        name: String,
        descriptor: ToolDescriptor,
        read_only: bool,
    ) -> Self {
        Self {
            server,
            name,
            descriptor,
            read_only,
        }
    }

    /// The tool's name on its server.
    pub fn server_tool_name(&self) -> &str {
        &self.name
    }
}

#[async_trait::async_trait]
impl Tool for McpTool {
    fn descriptor(&self) -> ToolDescriptor {
        self.descriptor.clone()
    }

    /// As the server annotates it (`readOnlyHint`); a tool without the
    /// annotation may have side effects.
    fn read_only(&self) -> bool {
        self.read_only
    }

    async fn execute(
        &self,
        args: serde_json::Value,
        _ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        self.server.call(&self.name, args, self.read_only).await
    }
}
