//! [`App`]: the `rein` binary with your own Rust tools and plugins.
//!
//! The deployment file can name MCP tools and the built-in plugins; a tool
//! or plugin written in Rust needs a program that knows it. `App` is that
//! program's whole `main`: register the tools and plugins, and it runs the
//! same commands as `rein` (`serve`, `run`, `check`, `replay`, with the same
//! flags, logs and exit codes). The deployment's agents list a Rust tool by
//! its name under `tools` and a Rust plugin by its id under `plugin_ids`;
//! the file is checked against them, with line and column, before anything
//! starts.
//!
//! ```no_run
//! use rein::schemars;
//! use rein::tools::tool_fn;
//! use rein_server::App;
//!
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Order {
//!     /// The order's number.
//!     id: u32,
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     let lookup = tool_fn("lookup_order", "Looks an order up.", |order: Order, _ctx| async move {
//!         Ok(format!("order {} ships tomorrow", order.id))
//!     });
//!     // rein.yaml: agents: [ { id: shop, model_id: m, tools: [lookup_order] } ]
//!     App::new().with_tool(lookup).main()
//! }
//! ```

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;

use rein::plugin::Plugin;
use rein::tools::Tool;

use crate::deployment::Extras;

/// The `rein` commands over a deployment file plus Rust tools and plugins.
#[derive(Clone, Default)]
pub struct App {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    plugins: BTreeMap<String, Arc<dyn Plugin>>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .field("plugins", &self.plugins.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl App {
    /// No tools or plugins: exactly the `rein` binary.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tool, listed by agents under `tools` by its descriptor's
    /// name. A later tool of the same name replaces an earlier one.
    #[must_use]
    pub fn with_tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools.insert(tool.descriptor().name, tool);
        self
    }

    /// Adds a plugin, listed by agents under `plugin_ids` as `id`. A later
    /// plugin of the same id replaces an earlier one.
    #[must_use]
    pub fn with_plugin(mut self, id: impl Into<String>, plugin: Arc<dyn Plugin>) -> Self {
        self.plugins.insert(id.into(), plugin);
        self
    }

    /// The names a deployment file may use for these tools and plugins
    /// ([`Deployment::load_with`](crate::deployment::Deployment::load_with)).
    pub fn extras(&self) -> Extras {
        Extras {
            tools: self.tools.keys().cloned().collect(),
            plugins: self.plugins.keys().cloned().collect(),
        }
    }

    /// Runs the `rein` command the process's arguments name (`serve`,
    /// `run`, `check`, `replay`), with these tools and plugins; returns its
    /// exit code. Starts its own tokio runtime: call it from a plain `main`.
    pub fn main(&self) -> ExitCode {
        crate::cli::main_with(self)
    }

    /// The tool named `name`.
    pub(crate) fn tool(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.get(name).cloned()
    }

    /// Every plugin, by id.
    pub(crate) fn plugins(&self) -> impl Iterator<Item = (&String, &Arc<dyn Plugin>)> {
        self.plugins.iter()
    }
}
