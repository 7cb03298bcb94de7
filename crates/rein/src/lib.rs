//! Rein: a Rust runtime for LLM agents, centred on run control — when a run
//! stops, why, how it is cancelled, and what happens when new input reaches
//! a thread that already has a run going.
//!
//! This crate is the facade: it only re-exports `rein-runtime-contract` (as
//! [`contract`]), `rein-runtime` and `rein-providers` (as [`engine`]), and
//! the two crates a tool is written with, [`async_trait`](mod@async_trait)
//! and [`serde_json`], so a program needs no dependency but `rein` (and its
//! async runtime).
//!
//! # The model
//!
//! An [`AgentRuntime`] runs an agent ([`AgentSpec`]) on a thread: it feeds the
//! thread's history to the agent's model, executes the tool calls the model
//! asks for, and repeats until the model answers without tools, a stop policy
//! or a hook ends the run, or it is cancelled. The result is an
//! [`AgentRunResult`] whose [`TerminationReason`] says exactly why the run
//! ended, and the run's last event is always one `RunFinished`.
//!
//! - **Executors** ([`engine`]) talk to models; **tools** do the work.
//! - **Plugins** ([`plugin`]) add typed state, [`phase`] hooks and tools to
//!   the agents that list their ids in `AgentSpec.plugin_ids`.
//! - **Stop policies** ([`policies`]) end runs; `max_rounds` and
//!   `stop_conditions` of the spec are always enforced.
//! - **Cancellation**: every run has its own [`CancellationToken`]; a
//!   [`Mailbox`] interrupts a thread's run when new input arrives.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use rein::prelude::*;
//!
//! struct Clock;
//! #[rein::async_trait]
//! impl Tool for Clock {
//!     fn descriptor(&self) -> ToolDescriptor {
//!         ToolDescriptor::new("clock", "tells the time")
//!     }
//!     async fn execute(&self, _args: rein::serde_json::Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
//!         Ok(ToolOutput::text("12:00"))
//!     }
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let model = ScriptedExecutor::new(vec![
//!     ScriptedResponse::tool_call("clock", rein::serde_json::json!({})),
//!     ScriptedResponse::text("It is noon."),
//! ]);
//! let runtime = AgentRuntimeBuilder::new()
//!     .with_agent_spec(AgentSpec::new("assistant").with_model_id("scripted"))
//!     .with_model(ModelSpec::new("scripted", "offline", "script"))
//!     .with_provider("offline", Arc::new(model))
//!     .with_tool("clock", Arc::new(Clock))
//!     .build()?;
//! let result = runtime
//!     .run_to_completion(RunRequest::new("thread-1", vec![Message::user("What time is it?")]))
//!     .await?;
//! assert_eq!(result.termination, TerminationReason::NaturalEnd);
//! assert_eq!(result.response, "It is noon.");
//! assert_eq!(runtime.thread_messages("thread-1").await.len(), 4);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! # What is re-exported where
//!
//! | path | from |
//! |---|---|
//! | [`contract`] | `rein-runtime-contract`: messages, specs, events, inference, tools, phases, state |
//! | [`registry_spec`] | [`AgentSpec`], [`ModelSpec`] |
//! | [`config`] | YAML/JSON loaders for agent specs and stop conditions |
//! | [`auto`], [`detectors`], [`plugin`], [`plugins`], [`phase`], [`policies`], [`thread_store`] | `rein-runtime` modules |
//! | [`engine`] | executors from `rein-providers` |
//! | root | the runtime, its builder, requests, results, errors |
//! | [`async_trait`](mod@async_trait) | the `async-trait` crate; its attribute is also `#[rein::async_trait]`, for `impl Tool`, `PhaseHook`, `LlmExecutor` |
//! | [`serde_json`] | the `serde_json` crate: tool arguments and results (`Value`, `json!`) |
//! | [`prelude`] | what a typical program imports: the names above plus [`GenaiExecutor`](engine::GenaiExecutor), the [`config`] loaders and [`ConfigError`](config::ConfigError) |

pub use rein_runtime_contract as contract;

#[cfg(feature = "otel")]
pub mod otel;

/// The `async-trait` crate, which Rein's traits are declared with. Its
/// attribute is re-exported too, as `#[rein::async_trait]`.
pub use ::async_trait;
pub use ::async_trait::async_trait;

/// The `serde_json` crate: tool arguments and results are `serde_json::Value`s.
pub use serde_json;

/// The `serde` crate, for typed tools' arguments and outputs. Its derive
/// needs `serde` in your `Cargo.toml`, or `#[serde(crate = "rein::serde")]`.
pub use serde;

/// The `schemars` crate (1.x), which generates typed tools' schemas. With
/// `use rein::schemars;` in scope, `#[derive(schemars::JsonSchema)]` works
/// without a `schemars` dependency of your own.
pub use schemars;

pub use rein_runtime_contract::config;

pub use rein_runtime::{
    auto, detectors, phase, plugin, plugins, policies, telemetry, thread_store,
};

/// Tools: the [`Tool`](tools::Tool) trait and its types, and typed tools —
/// [`tool_fn`](tools::tool_fn) for an async closure, [`TypedTool`](tools::TypedTool)
/// with [`typed`](tools::typed) for a trait impl — whose parameters schema
/// is generated from the arguments' type.
pub mod tools {
    pub use rein_runtime::tools::{TypedTool, parameters_schema, tool_fn, typed};
    pub use rein_runtime_contract::tool::{
        Tool, ToolContext, ToolDescriptor, ToolError, ToolOutput,
    };
}

/// Events: what a run reports as it goes ([`AgentEvent`](events::AgentEvent)),
/// where it goes ([`EventSink`](events::EventSink), [`RunStream`](events::RunStream)),
/// and a ready-made [`TerminalPrinter`](events::TerminalPrinter).
pub mod events {
    pub use rein_runtime::{RunStream, TerminalPrinter};
    pub use rein_runtime_contract::event::{
        AgentEvent, CancelCause, CollectingSink, EventSink, NullSink,
    };
}

/// Agent and model specifications.
pub mod registry_spec {
    pub use rein_runtime_contract::spec::{AgentSpec, ModelSpec};
}

/// LLM executors: [`GenaiExecutor`](engine::GenaiExecutor) for real
/// providers (through the re-exported [`genai`](engine::genai) crate) and
/// [`ScriptedExecutor`](engine::ScriptedExecutor) for tests and offline runs.
pub mod engine {
    pub use rein_providers::genai;
    pub use rein_providers::{GenaiExecutor, ScriptedExecutor, ScriptedResponse};
}

pub use rein_runtime::{
    AgentRunResult, AgentRuntime, AgentRuntimeBuilder, BuildError, DEFAULT_CANCEL_WAIT_TIMEOUT,
    Mailbox, RunHandle, RunObserver, RunRequest, RunStream, RuntimeError, TerminalPrinter,
};
pub use rein_runtime_contract::CancellationToken;
pub use rein_runtime_contract::event::CollectingSink;
pub use rein_runtime_contract::lifecycle::TerminationReason;
pub use rein_runtime_contract::spec::{AgentSpec, ModelSpec};

/// The names a typical Rein program uses. Nothing in it is named `Result`,
/// `Error`, `spec` or `request`: `use rein::prelude::*;` shadows nothing in
/// std's prelude and is never ambiguous with another glob's `Result` or
/// `Error` (`std::io::*`, `std::fmt::*`).
pub mod prelude {
    pub use rein_providers::{GenaiExecutor, ScriptedExecutor, ScriptedResponse};
    pub use rein_runtime::phase::{HookError, PhaseContext, PhaseHook};
    pub use rein_runtime::plugin::{Plugin, PluginRegistrar};
    pub use rein_runtime::tools::{TypedTool, tool_fn, typed};
    pub use rein_runtime::{
        AgentRunResult, AgentRuntime, AgentRuntimeBuilder, BuildError, Mailbox, RunHandle,
        RunRequest, RunStream, RuntimeError, TerminalPrinter,
    };
    pub use rein_runtime_contract::CancellationToken;
    pub use rein_runtime_contract::config::{
        ConfigError, load_agent_spec_file, load_agent_spec_yaml, load_stop_conditions_file,
        load_stop_conditions_yaml,
    };
    pub use rein_runtime_contract::event::{AgentEvent, CancelCause, CollectingSink, EventSink};
    pub use rein_runtime_contract::inference::{InferenceError, LlmExecutor, ToolChoice};
    pub use rein_runtime_contract::lifecycle::{
        StopConditionSpec, StoppedReason, TerminationReason,
    };
    pub use rein_runtime_contract::message::{Message, Role, TokenUsage, ToolCall};
    pub use rein_runtime_contract::phase::Phase;
    pub use rein_runtime_contract::spec::{AgentSpec, ModelSpec};
    pub use rein_runtime_contract::state::{StateError, StateKey};
    pub use rein_runtime_contract::tool::{
        Tool, ToolContext, ToolDescriptor, ToolError, ToolOutput,
    };
}

/// The README's code, compiled as a doc test so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
mod readme {}

/// The cancellation guide's code, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/cancellation.md")]
mod cancellation_doc {}

/// The auto-mode guide's code, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/auto-mode.md")]
mod auto_mode_doc {}

/// The stop-policies how-to's code, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/stop-policies.md")]
mod stop_policies_doc {}
