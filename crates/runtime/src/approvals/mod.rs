//! Tool approvals: the gate that lets a call run, denies it or holds it
//! for a person, and the parked state a run waits in until every held call
//! is decided.
//!
//! ```text
//! round's calls ──gate──> allow ──> run with the round
//!                   ├───> deny  ──> "not run: denied by an approval rule (…)"
//!                   └───> ask / ask_user ──> pending
//! round's other calls done, results stored ──> park:
//!   approval_requested per pending call; the deadline is paused
//!   wait for: every call decided | a rule's timeout | cancel
//! decided ──> approval_decided per call ──> approved/edited calls run with
//!   exactly those arguments; rejected/responded ones get their results;
//!   then the next inference (the model is not asked again in between)
//! ```
//!
//! **Invariant:** a held call runs at most once, and only after an
//! `approve` or `edit` decision: decisions are recorded under the parked
//! state's lock, a call's first decision is final, and the run reads them
//! once, when every call is decided.
//!
//! **Invariant:** a run that ends while parked (cancel, new input,
//! `approval_timeout`) records each undecided call `not_started` and lists
//! it in its stop report's `pending_approvals`.

mod ask_user;
mod schema;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use rein_runtime_contract::approval::{
    ApprovalAction, CompiledRule, Decider, Decision, OnTimeout, PendingApproval, PendingKind,
    rfc3339,
};
use rein_runtime_contract::message::ToolCall;
use rein_runtime_contract::spec::AgentSpec;
use rein_runtime_contract::tool::{ToolDescriptor, ToolSchema};
use tokio::sync::Notify;

pub use ask_user::{ASK_USER, AskUserPlugin};

/// The approval rules of one agent, compiled.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    rules: Vec<CompiledRule>,
    /// Whether the agent has the `ask_user` tool.
    pub(crate) asks_user: bool,
}

/// What the gate says about one call.
#[derive(Debug)]
pub(crate) enum Gated<'a> {
    Run,
    Deny(&'a CompiledRule),
    Ask(&'a CompiledRule),
    Question,
}

impl Gate {
    /// The agent's rules, checked: each compiles and matches at least one
    /// of `tools`. `Err` names the rule (by its position) and what to fix.
    pub(crate) fn new(
        spec: &AgentSpec,
        tools: &[ToolDescriptor],
        asks_user: bool,
    ) -> Result<Self, String> {
        let mut rules = Vec::with_capacity(spec.approvals.len());
        for (i, rule) in spec.approvals.iter().enumerate() {
            let compiled = rule
                .compiled()
                .map_err(|e| format!("approvals[{i}]: {e}"))?;
            if !tools.iter().any(|t| rule.matches_tool(&t.name)) {
                let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
                names.sort_unstable();
                return Err(format!(
                    "approvals[{i}]: tool \"{}\" matches none of the agent's tools ({}); fix the name or the glob",
                    rule.tool,
                    if names.is_empty() {
                        "it has none".to_owned()
                    } else {
                        names.join(", ")
                    }
                ));
            }
            rules.push(compiled);
        }
        Ok(Self { rules, asks_user })
    }

    /// Whether the gate can hold or deny anything.
    pub(crate) fn is_open(&self) -> bool {
        self.rules.is_empty() && !self.asks_user
    }

    /// What happens to `call`: the first matching rule decides.
    pub(crate) fn check(&self, call: &ToolCall) -> Gated<'_> {
        if self.asks_user && call.name == ASK_USER {
            return Gated::Question;
        }
        match self
            .rules
            .iter()
            .find(|r| r.matches(&call.name, &call.arguments))
        {
            Some(rule) => match rule.rule.action {
                ApprovalAction::Allow => Gated::Run,
                ApprovalAction::Deny => Gated::Deny(rule),
                ApprovalAction::Ask => Gated::Ask(rule),
            },
            None => Gated::Run,
        }
    }
}

/// One held call while its run is parked.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) pending: PendingApproval,
    /// When its rule's timeout passes, and what that does.
    pub(crate) deadline: Option<(tokio::time::Instant, Duration, OnTimeout)>,
    pub(crate) decision: Option<Decision>,
    /// Who took the decision, and when (none for a timeout).
    pub(crate) decider: Option<Decider>,
    /// Whether the decision is its rule's timeout (`on_timeout: reject`).
    pub(crate) timed_out: bool,
    /// The tool's parameters, to check edited arguments against.
    pub(crate) parameters: ToolSchema,
}

impl Held {
    /// `pending` waiting for a person, with no timeout (a detector's
    /// escalation, or a call checked outside its run).
    pub(crate) fn waiting(pending: PendingApproval) -> Self {
        Self {
            pending,
            deadline: None,
            decision: None,
            decider: None,
            timed_out: false,
            parameters: ToolSchema::default(),
        }
    }

    /// A held call carried on from `pending` (its timeout counted from its
    /// `expires_at`, which a rule of `gate` set).
    pub(crate) fn resumed(
        pending: PendingApproval,
        gate: &Gate,
        call: &ToolCall,
        parameters: ToolSchema,
    ) -> Self {
        let deadline = match (gate.check(call), pending.expires_at.as_deref()) {
            (Gated::Ask(rule), Some(at)) => rule.rule.timeout_seconds.and_then(|secs| {
                let at = rein_runtime_contract::approval::parse_rfc3339(at)?;
                let left = at
                    .duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO);
                Some((
                    tokio::time::Instant::now() + left,
                    Duration::from_secs(secs),
                    rule.rule.on_timeout,
                ))
            }),
            _ => None,
        };
        Self {
            pending,
            deadline,
            decision: None,
            decider: None,
            timed_out: false,
            parameters,
        }
    }

    /// A held call of `call` in `run_id` on `thread_id`.
    pub(crate) fn new(
        ids: (&str, &str),
        call: &ToolCall,
        gated: &Gated<'_>,
        parameters: ToolSchema,
    ) -> Self {
        let mut pending =
            PendingApproval::new(ids.0, ids.1, &call.id, &call.name, call.arguments.clone());
        let mut deadline = None;
        match gated {
            Gated::Ask(rule) => {
                pending.rule = Some(rule.rule.describe());
                if let Some(secs) = rule.rule.timeout_seconds {
                    let after = Duration::from_secs(secs);
                    pending.expires_at = Some(rfc3339(SystemTime::now() + after));
                    deadline = Some((
                        tokio::time::Instant::now() + after,
                        after,
                        rule.rule.on_timeout,
                    ));
                }
            }
            Gated::Question => {
                pending.kind = PendingKind::Question;
                let (question, options) = ask_user::question_of(&call.arguments);
                pending.question = Some(question);
                pending.options = options;
            }
            Gated::Run | Gated::Deny(_) => {}
        }
        Self {
            pending,
            deadline,
            decision: None,
            decider: None,
            timed_out: false,
            parameters,
        }
    }
}

/// A parked run to carry on in another process (or after a restart):
/// what its `run_parked` event said, and the decisions taken since. Its
/// thread's stored history holds the parked round (the assistant message
/// with the held calls, and the other calls' results).
///
/// A run carried on so starts its detectors' windows and its plugins'
/// state afresh; its rounds, usage and active time go on from the park.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ParkedRun {
    /// The run (it keeps its id).
    pub run_id: String,
    /// Its thread.
    pub thread_id: String,
    /// Its agent.
    pub agent_id: String,
    /// The calls it waits on.
    pub pending: Vec<PendingApproval>,
    /// Decisions already taken, by call id.
    pub decisions: Vec<(String, Decision)>,
    /// Who took them and when, by call id.
    pub deciders: Vec<(String, Decider)>,
    /// Calls its rule's timeout answered (`on_timeout: reject`) while it
    /// waited: no person decides them any more (carried on, the run
    /// answers them as timed out).
    pub timed_out: Vec<String>,
    /// Inferences made before the park.
    pub steps: u32,
    /// Usage before the park.
    pub usage: rein_runtime_contract::message::TokenUsage,
    /// Time the run was active before the park.
    pub active: Duration,
}

impl ParkedRun {
    /// A parked run of `agent_id` as its `run_parked` event described it.
    pub fn new(
        run_id: impl Into<String>,
        thread_id: impl Into<String>,
        agent_id: impl Into<String>,
        pending: Vec<PendingApproval>,
    ) -> Self {
        Self {
            run_id: run_id.into(),
            thread_id: thread_id.into(),
            agent_id: agent_id.into(),
            pending,
            decisions: Vec::new(),
            deciders: Vec::new(),
            timed_out: Vec::new(),
            steps: 0,
            usage: Default::default(),
            active: Duration::ZERO,
        }
    }
}

impl ParkedRun {
    /// Whether every call it waits on has a decision.
    pub fn is_decided(&self) -> bool {
        self.undecided().next().is_none()
    }

    /// The calls still waiting for a decision (neither decided nor timed
    /// out).
    pub fn undecided(&self) -> impl Iterator<Item = &PendingApproval> {
        self.pending.iter().filter(|p| {
            !self.decisions.iter().any(|(c, _)| *c == p.call_id)
                && !self.timed_out.contains(&p.call_id)
        })
    }

    /// Records `decision` on `call_id` with [`Parked::decide`]'s checks
    /// (`parameters`: a tool's parameter schema by name).
    pub(crate) fn decide(
        &mut self,
        call_id: &str,
        decision: Decision,
        decider: Decider,
        parameters: impl Fn(&str) -> ToolSchema,
    ) -> Result<Decided, ApprovalError> {
        let check = Parked::default();
        check.hold(
            self.pending
                .iter()
                .map(|p| {
                    let mut held = Held::waiting(p.clone());
                    held.parameters = parameters(&p.tool);
                    held.decision = self
                        .decisions
                        .iter()
                        .find(|(c, _)| *c == p.call_id)
                        .map(|(_, d)| d.clone());
                    held
                })
                .collect(),
        );
        let decided = check.decide(&self.run_id, call_id, decision.clone(), decider.clone())?;
        if !decided.repeated {
            self.decisions.push((call_id.to_owned(), decision));
            self.deciders.push((call_id.to_owned(), decider));
        }
        Ok(decided)
    }
}

/// Checks edited `arguments` against a tool's `parameters` schema (the
/// check [`AgentRuntime::decide`](crate::AgentRuntime::decide) makes), for
/// a process that records a decision for a run parked elsewhere.
///
/// # Errors
/// What does not fit, naming the field.
pub fn check_arguments(
    parameters: &serde_json::Value,
    arguments: &serde_json::Value,
) -> Result<(), String> {
    schema::check(parameters, arguments)
}

/// What a run that lets go takes with it ([`Parked::let_go`]).
#[derive(Debug, Default)]
pub(crate) struct LetGo {
    /// The decisions taken, with who took them.
    pub(crate) decisions: Vec<(String, Decision, Option<Decider>)>,
    /// The calls a rule's timeout answered.
    pub(crate) timed_out: Vec<String>,
}

/// The parked state of a run: its held calls and their decisions. Shared
/// between the run (which waits on it) and whoever decides.
#[derive(Debug, Default)]
pub(crate) struct Parked {
    held: Mutex<Vec<Held>>,
    /// Set (under `held`'s lock) when the run lets go of its task: no
    /// decision reaches it here any more.
    gone: std::sync::atomic::AtomicBool,
    /// Woken when a decision completes the set.
    pub(crate) decided: Notify,
}

/// Why a decision was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApprovalError {
    /// No active run has this pending call.
    #[error(
        "no pending approval \"{call_id}\" in run \"{run_id}\": the run is unknown, not parked, or already went on"
    )]
    UnknownApproval {
        /// The run named.
        run_id: String,
        /// The call named.
        call_id: String,
    },
    /// The call was already decided differently.
    #[error("approval \"{call_id}\" was already decided: {decision}")]
    AlreadyDecided {
        /// The call.
        call_id: String,
        /// The first decision's name.
        decision: String,
    },
    /// The decision does not fit the call: edited arguments outside the
    /// tool's schema, or `approve`/`edit` on a question.
    #[error("decision on \"{call_id}\" refused: {message}")]
    Invalid {
        /// The call.
        call_id: String,
        /// What is wrong and how to fix it.
        message: String,
    },
}

impl ApprovalError {
    /// The error's code: `unknown_approval`, `already_decided` or `invalid_decision`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::UnknownApproval { .. } => "unknown_approval",
            Self::AlreadyDecided { .. } => "already_decided",
            Self::Invalid { .. } => "invalid_decision",
        }
    }
}

/// A decision taken (or the same one found again).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decided {
    /// The call.
    pub call_id: String,
    /// The decision's name.
    pub decision: &'static str,
    /// Whether this exact decision had been taken before (nothing changed).
    pub repeated: bool,
}

impl Decided {
    /// `decision` on `call_id`, taken now.
    pub fn taken(call_id: &str, decision: &Decision) -> Self {
        Self {
            call_id: call_id.to_owned(),
            decision: decision.name(),
            repeated: false,
        }
    }

    /// `decision` on `call_id`, taken before (nothing changes).
    pub fn repeated(call_id: &str, decision: &Decision) -> Self {
        Self {
            call_id: call_id.to_owned(),
            decision: decision.name(),
            repeated: true,
        }
    }
}

impl Parked {
    fn held(&self) -> MutexGuard<'_, Vec<Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds `calls` (replacing any earlier set).
    pub(crate) fn hold(&self, calls: Vec<Held>) {
        *self.held() = calls;
    }

    /// Lets the run go of its task, unless every call is decided already
    /// (`None`: the run goes on here). From then on no decision is taken
    /// here (they are `UnknownApproval`, for whoever carries the run on);
    /// returns the ones taken so far.
    pub(crate) fn let_go(&self) -> Option<LetGo> {
        let held = self.held();
        if held.iter().all(|h| h.decision.is_some()) {
            return None;
        }
        self.gone.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut taken = LetGo::default();
        for h in held.iter() {
            let call_id = h.pending.call_id.clone();
            match &h.decision {
                Some(_) if h.timed_out => taken.timed_out.push(call_id),
                Some(decision) => {
                    taken
                        .decisions
                        .push((call_id, decision.clone(), h.decider.clone()))
                }
                None => {}
            }
        }
        Some(taken)
    }

    /// The calls still waiting for a decision.
    pub(crate) fn pending(&self) -> Vec<PendingApproval> {
        let held = self.held();
        if self.gone.load(std::sync::atomic::Ordering::SeqCst) {
            return Vec::new();
        }
        held.iter()
            .filter(|h| h.decision.is_none())
            .map(|h| h.pending.clone())
            .collect()
    }

    /// Every held call, decided or not.
    pub(crate) fn all(&self) -> Vec<Held> {
        self.held().clone()
    }

    /// The soonest undecided deadline.
    pub(crate) fn next_deadline(&self) -> Option<tokio::time::Instant> {
        self.held()
            .iter()
            .filter(|h| h.decision.is_none())
            .filter_map(|h| h.deadline.map(|d| d.0))
            .min()
    }

    /// Whether every held call is decided.
    pub(crate) fn complete(&self) -> bool {
        self.held().iter().all(|h| h.decision.is_some())
    }

    /// Records `decision` on `call_id` (see [`ApprovalError`]); wakes the
    /// run when it completes the set.
    pub(crate) fn decide(
        &self,
        run_id: &str,
        call_id: &str,
        decision: Decision,
        decider: Decider,
    ) -> Result<Decided, ApprovalError> {
        let mut held = self.held();
        let gone = self.gone.load(std::sync::atomic::Ordering::SeqCst);
        let Some(entry) = held
            .iter_mut()
            .find(|h| h.pending.call_id == call_id)
            .filter(|_| !gone)
        else {
            return Err(ApprovalError::UnknownApproval {
                run_id: run_id.to_owned(),
                call_id: call_id.to_owned(),
            });
        };
        let name = decision.name();
        if let Some(first) = &entry.decision {
            return if *first == decision {
                Ok(Decided {
                    call_id: call_id.to_owned(),
                    decision: name,
                    repeated: true,
                })
            } else {
                Err(ApprovalError::AlreadyDecided {
                    call_id: call_id.to_owned(),
                    decision: if entry.timed_out {
                        "timeout".to_owned()
                    } else {
                        first.name().to_owned()
                    },
                })
            };
        }
        let invalid = |message: String| ApprovalError::Invalid {
            call_id: call_id.to_owned(),
            message,
        };
        let escalation = matches!(
            decision,
            Decision::Continue { .. } | Decision::Stop | Decision::TakeOver
        );
        match (&decision, entry.pending.kind) {
            (_, PendingKind::Escalation) if !escalation => {
                return Err(invalid(
                    "an escalation is answered with `continue` (optionally with a `message`), `stop` or `take_over`".into(),
                ));
            }
            (_, PendingKind::Approval | PendingKind::Question) if escalation => {
                return Err(invalid(format!(
                    "`{}` answers an escalation; a tool call is decided with `approve`, `reject`, `edit` or `respond`",
                    decision.name()
                )));
            }
            (Decision::Approve | Decision::Edit { .. }, PendingKind::Question) => {
                return Err(invalid(
                    "a question is answered with `respond` (its `result` is the answer) or declined with `reject`".into(),
                ));
            }
            (Decision::Edit { arguments }, _) => {
                schema::check(&entry.parameters, arguments)
                    .map_err(|e| invalid(format!("edited arguments: {e}")))?;
            }
            _ => {}
        }
        entry.decision = Some(decision);
        entry.decider = Some(decider);
        let complete = held.iter().all(|h| h.decision.is_some());
        drop(held);
        if complete {
            self.decided.notify_one();
        }
        Ok(Decided {
            call_id: call_id.to_owned(),
            decision: name,
            repeated: false,
        })
    }

    /// Decides every undecided call whose deadline passed by `now` with
    /// `on_timeout: reject`; returns the calls decided so, and whether
    /// one whose rule says `stop` timed out.
    pub(crate) fn expire(&self, now: tokio::time::Instant) -> (Vec<String>, Option<String>) {
        let mut held = self.held();
        let mut rejected = Vec::new();
        let mut stop = None;
        for h in held.iter_mut().filter(|h| h.decision.is_none()) {
            let Some((at, after, on_timeout)) = h.deadline else {
                continue;
            };
            if at > now {
                continue;
            }
            match on_timeout {
                OnTimeout::Reject => {
                    h.decision = Some(Decision::Respond {
                        result: serde_json::Value::String(format!(
                            "not run: no decision within {} s",
                            after.as_secs()
                        )),
                    });
                    h.timed_out = true;
                    rejected.push(h.pending.call_id.clone());
                }
                OnTimeout::Stop => {
                    stop.get_or_insert_with(|| {
                        format!(
                            "no decision on call {} ({}) within {} s",
                            h.pending.call_id,
                            h.pending.tool,
                            after.as_secs()
                        )
                    });
                }
            }
        }
        (rejected, stop)
    }
}

/// The pending entry an `approval_requested` event announces (a
/// question's text and options read from its arguments); `None` for any
/// other event.
pub fn pending_of(event: &rein_runtime_contract::event::AgentEvent) -> Option<PendingApproval> {
    let rein_runtime_contract::event::AgentEvent::ApprovalRequested {
        run_id,
        thread_id,
        call_id,
        tool,
        arguments,
        kind,
        expires_at,
    } = event
    else {
        return None;
    };
    let mut pending = PendingApproval::new(run_id, thread_id, call_id, tool, arguments.clone());
    pending.kind = *kind;
    pending.expires_at.clone_from(expires_at);
    if *kind == PendingKind::Question {
        let (question, options) = ask_user::question_of(arguments);
        pending.question = Some(question);
        pending.options = options;
    }
    Some(pending)
}

/// The result text of a rejected call.
pub(crate) fn rejected_text(reason: Option<&str>) -> String {
    match reason {
        Some(r) if !r.trim().is_empty() => format!("not run: rejected: {r}"),
        _ => "not run: rejected by a person".to_owned(),
    }
}

/// The result text of a call a rule denied.
pub(crate) fn denied_text(rule: &CompiledRule) -> String {
    format!(
        "not run: denied by an approval rule ({})",
        rule.rule.describe()
    )
}

/// `parked`'s state, shared with the run's control block.
pub(crate) type SharedParked = Arc<Parked>;
