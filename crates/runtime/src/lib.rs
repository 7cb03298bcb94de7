//! The Rein engine: runs agents.
//!
//! # The model in one line
//!
//! An [`AgentRuntime`] takes a [`RunRequest`] for a thread, takes that
//! thread's slot, and runs rounds — inference, then the tool calls it asked
//! for — until the model answers without tools, a stop policy or hook ends
//! the run, or it is cancelled; the result is an [`AgentRunResult`] and the
//! last event is always one `RunFinished`.
//!
//! # The roles
//!
//! - The [`AgentRuntimeBuilder`] registers agents, models, providers
//!   (executors), tools and [`plugin`]s by id and checks them at `build()`.
//! - [`plugin`]s contribute typed state keys, [`phase`] hooks and tools to
//!   the agents that list them in `plugin_ids`.
//! - [`policies`] decide after each inference whether a run stops; the
//!   agent's `max_rounds` and `stop_conditions` are always enforced.
//! - The active-run registry keeps one run per thread; the [`Mailbox`]
//!   interrupts a thread's run when new input arrives.
//!
//! The executors live in `rein-providers`; this crate never depends on it.
//! Most users depend on the `rein` facade instead of this crate.

mod active_runs;
mod agent;
mod agent_loop;
pub mod approvals;
pub mod auto;
mod builder;
pub mod context;
pub mod detectors;
mod extensions;
pub mod history;
pub mod limits;
mod mailbox;
pub mod phase;
pub mod plugin;
pub mod plugins;
pub mod policies;
mod printer;
pub mod replay;
mod run;
mod runtime;
mod state;
mod stream;
mod subagents;
pub mod telemetry;
pub mod thread_store;
pub mod tools;

pub use builder::{AgentRuntimeBuilder, BuildError, DEFAULT_CANCEL_WAIT_TIMEOUT};
pub use extensions::RunObserver;
pub use mailbox::{Mailbox, RunHandle};
pub use printer::TerminalPrinter;
pub use run::{AgentRunResult, RunExit, RunRequest};
pub use runtime::{AgentRuntime, CancelToolCallError, RuntimeError};
pub use stream::RunStream;
