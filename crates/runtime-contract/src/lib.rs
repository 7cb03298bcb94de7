//! The vocabulary of Rein: plain data types and small traits shared by the
//! runtime, the providers and user code. There is no engine here.
//!
//! # The model in one line
//!
//! A *run* feeds the [`message`] history of a thread to an
//! [`LlmExecutor`](inference::LlmExecutor), executes the [`Tool`](tool::Tool)
//! calls the model asks for, and repeats until the model answers without tools
//! or a stop condition ([`lifecycle`]) ends it; everything it does is reported
//! as [`AgentEvent`](event::AgentEvent)s.
//!
//! # The roles
//!
//! - **Specs** ([`spec`]) describe an agent: its model, system prompt, round
//!   limit, plugins and declarative stop conditions.
//! - **Executors** ([`inference`]) turn an [`InferenceRequest`](inference::InferenceRequest)
//!   into a stream of [`InferenceDelta`](inference::InferenceDelta)s.
//! - **Tools** ([`tool`]) do work for the model and see the run's
//!   [`CancellationToken`].
//! - **Event sinks** ([`event`]) observe a run as it happens.
//!
//! A [`context`] policy says how a run keeps its prompt inside the model's
//! window; [`escalation`] ladders say what a detector does each time it
//! fires.
//!
//! Phases ([`phase`]) and typed per-run state keys ([`state`]) are the
//! vocabulary of the runtime's plugin system; [`config`] loads specs from YAML.
//!
//! **Invariant:** this crate depends on no async runtime and no HTTP client
//! (tokio enters only through `tokio-util`'s cancellation token).
//!
//! ```
//! use rein_runtime_contract::message::{Message, Role};
//! use rein_runtime_contract::lifecycle::TerminationReason;
//!
//! let m = Message::user("hello");
//! assert_eq!(m.role, Role::User);
//! let json = serde_json::to_string(&TerminationReason::NaturalEnd).unwrap();
//! assert_eq!(json, r#"{"type":"natural_end"}"#);
//! ```

pub mod approval;
pub mod config;
pub mod context;
pub mod escalation;
pub mod event;
pub mod inference;
pub mod lifecycle;
pub mod message;
pub mod phase;
pub mod spec;
pub mod state;
pub mod tool;

/// A cooperative cancellation signal; cloning shares it, [`child_token`](CancellationToken::child_token)
/// derives one that is cancelled with its parent.
///
/// This is `tokio_util::sync::CancellationToken`, re-exported: cancellation is
/// idempotent, visible to every clone at once, and `cancelled().await` never
/// misses a `cancel()` that happens concurrently.
pub use tokio_util::sync::CancellationToken;
