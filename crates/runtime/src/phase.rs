//! Phase hooks: plugin code that runs at fixed points of a run, with typed
//! access to the run's state.
//!
//! Hooks of one phase run **sequentially**: in `plugin_ids` order, then in
//! registration order, each with `&mut` access to the [`PhaseContext`]. A hook
//! steers the run only through the context's requests
//! ([`request_termination`](PhaseContext::request_termination),
//! [`push_user_message`](PhaseContext::push_user_message),
//! [`request_another_round`](PhaseContext::request_another_round)); the loop
//! acts on them at the next phase boundary.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use rein_runtime_contract::inference::{InferenceError, InferenceResponse};
use rein_runtime_contract::lifecycle::TerminationReason;
use rein_runtime_contract::message::{Message, ToolCall, ToolResult};
pub use rein_runtime_contract::phase::Phase;
use rein_runtime_contract::state::{StateError, StateKey};

use crate::plugin::HookEntry;
use crate::policies::{StopPolicyStats, StopStatsKey};
use crate::state::RunState;

/// Code that runs at one [`Phase`] of every run of the agents listing its plugin.
///
/// Returning `Ok(())` lets the run go on (subject to what the hook requested
/// through the context). Returning `Err` — or panicking — ends the run with
/// `TerminationReason::Error("hook <plugin id> at <phase>: <message>")`, after
/// the history is repaired; later hooks of that phase do not run.
#[async_trait::async_trait]
pub trait PhaseHook: Send + Sync {
    /// Runs the hook.
    ///
    /// # Errors
    ///
    /// A [`HookError`] ends the run (see the trait docs).
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError>;
}

/// A hook's failure; it ends the run with an error naming the plugin and phase.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HookError {
    message: String,
}

impl HookError {
    /// An error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<StateError> for HookError {
    fn from(e: StateError) -> Self {
        Self::new(e.to_string())
    }
}

/// What hooks asked the loop to do; read at the next phase boundary.
#[derive(Debug, Default)]
pub(crate) struct Directives {
    pub(crate) termination: Option<TerminationReason>,
    pub(crate) user_messages: Vec<String>,
    pub(crate) another_round: bool,
    /// A detector's `escalate` step: the run parks for a person before
    /// its next inference.
    /// Boxed: a run that never escalates pays a pointer for it.
    pub(crate) escalation: Option<Box<rein_runtime_contract::lifecycle::StoppedReason>>,
    /// Events built-in plugins report (`plan_updated`), sent once the
    /// phase's hooks have run.
    pub(crate) events: Vec<rein_runtime_contract::event::AgentEvent>,
}

/// The identity of a run, shared by all its contexts.
#[derive(Debug, Clone)]
pub(crate) struct RunIdentity {
    pub(crate) thread_id: Arc<str>,
    pub(crate) run_id: Arc<str>,
    pub(crate) agent_id: Arc<str>,
}

/// What a hook sees and may change: the run's identity, its typed state, the
/// history, the latest inference, the current tool call, and requests to the
/// loop.
pub struct PhaseContext<'a> {
    pub(crate) phase: Phase,
    pub(crate) run: &'a RunIdentity,
    pub(crate) step: u32,
    pub(crate) state: &'a mut RunState,
    pub(crate) messages: &'a [Message],
    pub(crate) inference: Option<&'a InferenceResponse>,
    pub(crate) inference_error: Option<&'a InferenceError>,
    pub(crate) tool_call: Option<&'a ToolCall>,
    pub(crate) tool_result: Option<&'a ToolResult>,
    pub(crate) directives: &'a mut Directives,
    pub(crate) estimated_prompt_tokens: Option<u64>,
}

impl std::fmt::Debug for PhaseContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhaseContext")
            .field("phase", &self.phase)
            .field("run_id", &self.run.run_id)
            .field("step", &self.step)
            .finish_non_exhaustive()
    }
}

impl PhaseContext<'_> {
    /// The phase being run.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The run's thread.
    pub fn thread_id(&self) -> &str {
        &self.run.thread_id
    }

    /// The run.
    pub fn run_id(&self) -> &str {
        &self.run.run_id
    }

    /// The agent running.
    pub fn agent_id(&self) -> &str {
        &self.run.agent_id
    }

    /// The current round, from 1 (0 at `RunStart`).
    pub fn step(&self) -> u32 {
        self.step
    }

    /// The thread's history as the loop holds it now.
    pub fn messages(&self) -> &[Message] {
        self.messages
    }

    /// The latest successful inference of this round (from `AfterInference`
    /// on; `None` when it failed).
    pub fn inference(&self) -> Option<&InferenceResponse> {
        self.inference
    }

    /// The latest inference's error, at `AfterInference` of a failed round.
    pub fn inference_error(&self) -> Option<&InferenceError> {
        self.inference_error
    }

    /// The tool call at `BeforeToolExecute` and `AfterToolExecute`.
    pub fn tool_call(&self) -> Option<&ToolCall> {
        self.tool_call
    }

    /// The call's result at `AfterToolExecute`.
    pub fn tool_result(&self) -> Option<&ToolResult> {
        self.tool_result
    }

    /// The round statistics stop policies see (always present).
    pub fn stop_stats(&self) -> &StopPolicyStats {
        static EMPTY: std::sync::LazyLock<StopPolicyStats> =
            std::sync::LazyLock::new(StopPolicyStats::default);
        self.state.get::<StopStatsKey>().unwrap_or(&EMPTY)
    }

    /// The value of state key `K`.
    ///
    /// # Errors
    ///
    /// [`StateError::UnknownKey`] when no listed plugin registered `K`;
    /// [`StateError::TypeMismatch`] when it was registered with another type.
    pub fn state<K: StateKey>(&self) -> Result<&K::Value, StateError> {
        self.state.get::<K>()
    }

    /// Mutable access to the value of state key `K`.
    ///
    /// # Errors
    ///
    /// As for [`state`](Self::state).
    pub fn state_mut<K: StateKey>(&mut self) -> Result<&mut K::Value, StateError> {
        self.state.get_mut::<K>()
    }

    /// The estimated prompt tokens of the next inference as the history
    /// stands now (what the model would be sent, after offloading and
    /// compaction so far; see `docs/context.md`). `None` for agents without
    /// a context policy or a token budget, which do not estimate.
    pub fn estimated_prompt_tokens(&self) -> Option<u64> {
        self.estimated_prompt_tokens
    }

    /// Ends the run with `reason` at the next phase boundary. Tool calls not
    /// yet started get "not run" results; `StepEnd` hooks still run. The first
    /// request of a run wins; later ones are ignored.
    pub fn request_termination(&mut self, reason: TerminationReason) {
        self.directives.termination.get_or_insert(reason);
    }

    /// The termination requested so far in this run, if any.
    pub fn termination_requested(&self) -> Option<&TerminationReason> {
        self.directives.termination.as_ref()
    }

    /// Adds a user message to the history before the next inference (a
    /// nudge), and emits a `nudge` event. Requested during the last round,
    /// it is recorded but no further inference is made unless the run goes on.
    pub fn push_user_message(&mut self, text: impl Into<String>) {
        self.directives.user_messages.push(text.into());
    }

    /// Reports `event` on the run's stream once the phase's hooks have run
    /// (built-in plugins only: a plugin must not fake the loop's events).
    pub(crate) fn emit(&mut self, event: rein_runtime_contract::event::AgentEvent) {
        self.directives.events.push(event);
    }

    /// Overrides the next natural end of this round: the run makes another
    /// inference instead of ending because the model called no tool.
    pub fn request_another_round(&mut self) {
        self.directives.another_round = true;
    }
}

/// A hook that failed: which plugin, at which phase, and why.
#[derive(Debug)]
pub(crate) struct HookFailure {
    pub(crate) plugin_id: String,
    pub(crate) phase: Phase,
    pub(crate) message: String,
}

impl HookFailure {
    pub(crate) fn into_reason(self) -> TerminationReason {
        TerminationReason::Error(format!(
            "hook {} at {}: {}",
            self.plugin_id, self.phase, self.message
        ))
    }
}

/// Runs `hooks` in order on `ctx`; stops at the first failure or panic.
pub(crate) async fn dispatch(
    hooks: &[HookEntry],
    ctx: &mut PhaseContext<'_>,
) -> Result<(), HookFailure> {
    for entry in hooks {
        let outcome = AssertUnwindSafe(entry.hook.run(ctx)).catch_unwind().await;
        let message = match outcome {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e.message,
            Err(payload) => format!("panicked: {}", panic_message(payload.as_ref())),
        };
        return Err(HookFailure {
            plugin_id: entry.plugin_id.to_string(),
            phase: ctx.phase,
            message,
        });
    }
    Ok(())
}

/// The text of a panic payload, when it has one.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}
