//! Rein's run events as AG-UI events, sub-agents included.
//!
//! **Invariant:** every message, tool call and step this translator starts
//! it also ends before `RUN_FINISHED`/`RUN_ERROR`, and it emits nothing
//! after those. The same holds one level down: everything a sub-agent
//! started is ended before its `SUBAGENT_FINISHED`/`SUBAGENT_ERROR`, and
//! every sub-agent started is ended before the root's `RUN_FINISHED`
//! (also when the root is cancelled mid-tree).
//!
//! # Sub-agents
//!
//! A root run's log also holds its descendants' events (their `run_id` is
//! the child's), between a `subagent_started` and a `subagent_finished` on
//! the parent's run. They become AG-UI 1.0's sub-agent events:
//!
//! - `subagent_started` → `SUBAGENT_STARTED {subagentRunId: <child run
//!   id>, name: <agent id>, parentToolCallId: <the parent's toolCallId>,
//!   parentSubagentRunId?: <the parent's run id, when the parent is itself
//!   a sub-agent>}`.
//! - The child's events are translated like the root's (`STEP_*`,
//!   `TEXT_MESSAGE_*`, `TOOL_CALL_*`), each carrying `subagentRunId`, with
//!   open messages, tool calls and steps kept per run. The child's own
//!   `run_started` is not sent (its `SUBAGENT_STARTED` is its start); its
//!   `run_finished` ends its open message and step and is otherwise folded
//!   into the `SUBAGENT_*` that follows.
//! - `subagent_finished` → `SUBAGENT_ERROR {subagentRunId, message, code:
//!   "error"}` for an `error` termination, else `SUBAGENT_FINISHED
//!   {subagentRunId, result: {termination, stop_code?, stop_detail?,
//!   response, outputs?}}` (the outcome is omitted: AG-UI's sub-agent
//!   outcomes are only `success` and `suspended`, so a `cancelled` or
//!   `stopped` child says so in `result.termination`).
//! - Ids: message ids are `<run id>-m<n>` per run; a child's tool call ids
//!   are `<child run id>:<call id>` (two runs' models may reuse an id, and
//!   the client's verifier refuses one id owned by two runs).

use std::collections::{BTreeMap, HashMap, HashSet};

use rein::TerminationReason;
use rein::contract::approval::PendingKind;
use rein::events::AgentEvent;
use rein_service::AutoRecord;
use serde_json::{Value, json};

/// One run of the tree, as the stream has seen it so far.
struct Run {
    /// Its `subagentRunId`: `None` for the root.
    tag: Option<String>,
    /// The run that started it (`None` for the root).
    parent: Option<String>,
    next_id: u64,
    /// The open text message.
    text: Option<String>,
    /// The step's last text message (the parent of its tool calls).
    last_message: Option<String>,
    /// The open step's name.
    step: Option<String>,
    /// The text of its latest text message.
    last_text: String,
    /// From its `run_finished`: its answer and outputs.
    response: String,
    outputs: BTreeMap<String, Value>,
    /// Calls announced (`TOOL_CALL_START`…`END`) when they were held for
    /// approval: their start after the decision announces nothing again.
    announced: HashSet<String>,
    /// The AG-UI ids of its interrupts in the current park.
    interrupts: Vec<String>,
    /// For a sub-agent: its agent and its parent's AG-UI tool call id.
    agent: Option<String>,
    parent_call: Option<String>,
}

impl Run {
    fn new(tag: Option<String>, parent: Option<String>) -> Self {
        Self {
            tag,
            parent,
            next_id: 0,
            text: None,
            last_message: None,
            step: None,
            last_text: String::new(),
            response: String::new(),
            outputs: BTreeMap::new(),
            announced: HashSet::new(),
            interrupts: Vec::new(),
            agent: None,
            parent_call: None,
        }
    }

    /// `TOOL_CALL_START`, `_ARGS`, `_END` for one of its calls.
    fn announce_call(
        &mut self,
        call_id: &str,
        name: &str,
        arguments: &Value,
        emitted: &mut Vec<String>,
        out: &mut Vec<Value>,
    ) {
        self.end_text(out);
        let id = self.tool_call_id(call_id);
        emitted.push(id.clone());
        let mut start = json!({"type": "TOOL_CALL_START", "toolCallId": id, "toolCallName": name});
        if let Some(parent) = &self.last_message {
            start["parentMessageId"] = json!(parent);
        }
        out.push(self.tagged(start));
        out.push(self.tagged(
            json!({"type": "TOOL_CALL_ARGS", "toolCallId": id, "delta": arguments.to_string()}),
        ));
        out.push(self.tagged(json!({"type": "TOOL_CALL_END", "toolCallId": id})));
    }

    /// `value` with the run's `subagentRunId`, if it is a sub-agent.
    fn tagged(&self, mut value: Value) -> Value {
        if let Some(tag) = &self.tag {
            value["subagentRunId"] = json!(tag);
        }
        value
    }

    /// The AG-UI id of one of the run's tool calls.
    fn tool_call_id(&self, call_id: &str) -> String {
        match &self.tag {
            None => call_id.to_owned(),
            Some(run) => format!("{run}:{call_id}"),
        }
    }

    fn message_id(&mut self, run_id: &str, emitted: &mut Vec<String>) -> String {
        self.next_id += 1;
        let id = format!("{run_id}-m{}", self.next_id);
        emitted.push(id.clone());
        id
    }

    fn end_text(&mut self, out: &mut Vec<Value>) {
        if let Some(id) = self.text.take() {
            out.push(self.tagged(json!({"type": "TEXT_MESSAGE_END", "messageId": id})));
        }
    }

    fn end_step(&mut self, out: &mut Vec<Value>) {
        self.end_text(out);
        if let Some(name) = self.step.take() {
            out.push(self.tagged(json!({"type": "STEP_FINISHED", "stepName": name})));
        }
        self.last_message = None;
    }

    fn start_step(&mut self, name: String, out: &mut Vec<Value>) {
        self.end_step(out);
        out.push(self.tagged(json!({"type": "STEP_STARTED", "stepName": name})));
        self.step = Some(name);
    }

    /// The run's events that belong to it alone (steps, text, tool calls).
    fn translate(
        &mut self,
        run_id: &str,
        event: &AgentEvent,
        emitted: &mut Vec<String>,
        out: &mut Vec<Value>,
    ) {
        match event {
            AgentEvent::StepStarted { step, .. } => self.start_step(format!("step {step}"), out),
            AgentEvent::RetryStarted { step, attempt, .. } => {
                self.start_step(format!("step {step} (attempt {attempt})"), out);
            }
            AgentEvent::TextDelta { delta, .. } if !delta.is_empty() => {
                let id = match &self.text {
                    Some(id) => id.clone(),
                    None => {
                        let id = self.message_id(run_id, emitted);
                        out.push(self.tagged(json!({"type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant"})));
                        self.text = Some(id.clone());
                        self.last_message = Some(id.clone());
                        self.last_text.clear();
                        id
                    }
                };
                self.last_text.push_str(delta);
                out.push(self.tagged(
                    json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": delta}),
                ));
            }
            // A call announced when it was held is not announced again.
            AgentEvent::ToolCallStarted {
                call_id,
                name,
                arguments,
                ..
            } if !self.announced.remove(call_id) => {
                self.announce_call(call_id, name, arguments, emitted, out);
            }
            // A wait for the provider's limits: no AG-UI event says it, so
            // a custom one does.
            AgentEvent::ModelFallback {
                from_model,
                to_model,
                error,
                ..
            } => {
                out.push(self.tagged(json!({"type": "CUSTOM", "name": "model_fallback", "value": {"from_model": from_model, "to_model": to_model, "error": error}})));
            }
            // A model judging the run: no AG-UI event says it either.
            AgentEvent::ModelCheck {
                code,
                model_id,
                step,
                outcome,
                confidence,
                complete,
                detail,
                ..
            } => {
                out.push(self.tagged(json!({"type": "CUSTOM", "name": "model_check", "value": {"code": code, "model_id": model_id, "step": step, "outcome": outcome, "confidence": confidence, "complete": complete, "detail": detail}})));
            }
            AgentEvent::RateLimited {
                provider, wait_ms, ..
            } => {
                out.push(self.tagged(json!({"type": "CUSTOM", "name": "rate_limited", "value": {"provider": provider, "wait_ms": wait_ms}})));
            }
            AgentEvent::ToolCallFinished {
                call_id, result, ..
            } => {
                let id = self.message_id(run_id, emitted);
                let call = self.tool_call_id(call_id);
                out.push(self.tagged(json!({"type": "TOOL_CALL_RESULT", "messageId": id, "toolCallId": call, "content": result, "role": "tool"})));
            }
            _ => {}
        }
    }
}

/// An AG-UI interrupt for a held call (`id`): `tool_approval` with a
/// `responseSchema` for the decision, or `input_required` for an
/// `ask_user` question (its message the question, its schema the options).
fn interrupt(id: &str, tool: &str, arguments: &Value, kind: PendingKind) -> Value {
    if kind == PendingKind::Escalation {
        let detail = arguments["detail"].as_str().unwrap_or_default();
        return json!({
            "id": id, "reason": "escalation",
            "message": format!("{tool}: {detail}"),
            "responseSchema": {
                "type": "object",
                "properties": {
                    "decision": {"enum": ["continue", "stop", "take_over"]},
                    "message": {"type": "string"},
                },
                "required": ["decision"],
            },
        });
    }
    if kind == PendingKind::Question {
        let question = arguments
            .get("question")
            .and_then(Value::as_str)
            .map_or_else(|| arguments.to_string(), str::to_owned);
        let mut result = json!({"type": "string"});
        if let Some(options) = arguments.get("options").and_then(Value::as_array) {
            result["enum"] = json!(options);
        }
        return json!({
            "id": id, "reason": "input_required", "message": question,
            "responseSchema": {
                "type": "object",
                "properties": {"decision": {"const": "respond"}, "result": result},
                "required": ["decision", "result"],
            },
        });
    }
    json!({
        "id": id, "reason": "tool_approval",
        "message": format!("Approve calling {tool} with {arguments}?"),
        "responseSchema": {
            "type": "object",
            "properties": {
                "decision": {"enum": ["approve", "reject", "edit", "respond"]},
                "arguments": {"type": "object"},
                "reason": {"type": "string"},
                "result": {},
            },
            "required": ["decision"],
        },
    })
}

/// `{termination, stop_code?, stop_detail?}`: how a run ended, as in
/// `RUN_FINISHED`'s `result`.
fn termination_result(termination: &TerminationReason) -> Value {
    let mut result = json!({"termination": termination});
    if let TerminationReason::Stopped(reason) = termination {
        result["stop_code"] = json!(reason.code);
        result["stop_detail"] = json!(reason.detail);
    }
    result
}

/// Turns one run's events (its descendants' included) into AG-UI event
/// JSON texts.
pub(super) struct Translator {
    thread_id: String,
    /// The AG-UI run id (`RUN_STARTED`/`RUN_FINISHED`).
    run_id: String,
    /// The Rein run at the root (the AG-UI run id, except when a
    /// resumed stream carries a parked run on).
    root: String,
    /// The interrupts of the current park, in the order requested.
    interrupts: Vec<Value>,
    /// Whether the stream ended on an interrupt (the run goes on).
    suspended: bool,
    /// The root and the sub-agents not ended yet, by Rein run id.
    runs: HashMap<String, Run>,
    /// The sub-agents not ended yet, in the order they started.
    open_children: Vec<String>,
    /// Message and tool call ids emitted since the last `take_emitted_ids`.
    emitted: Vec<String>,
    done: bool,
    /// Whether the root's plan was sent as a `STATE_SNAPSHOT` (the next
    /// changes are `STATE_DELTA`s).
    state_sent: bool,
    /// Auto mode: the session's end, for `RUN_FINISHED`'s result.
    session_end: Option<AutoRecord>,
}

impl Translator {
    pub(super) fn new(thread_id: &str, run_id: &str) -> Self {
        Self {
            thread_id: thread_id.to_owned(),
            run_id: run_id.to_owned(),
            root: run_id.to_owned(),
            interrupts: Vec::new(),
            suspended: false,
            runs: HashMap::from([(run_id.to_owned(), Run::new(None, None))]),
            open_children: Vec::new(),
            emitted: Vec::new(),
            done: false,
            state_sent: false,
            session_end: None,
        }
    }

    /// Auto mode: a round's progress as `CUSTOM` `progress` events, each
    /// with the session's tokens (and `max_tokens` when the policy has a
    /// budget), as the source's progress messages carry them.
    fn progress(auto: &AutoRecord, round_run_id: &str) -> Vec<String> {
        auto.progress
            .iter()
            .map(|message| {
                let mut value = json!({
                    "message": message,
                    "session_id": auto.session_id,
                    "round": auto.round,
                    "round_run_id": round_run_id,
                    "tokens_used_session": auto.tokens_used_session,
                });
                if let Some(max) = auto.max_tokens {
                    value["max_tokens"] = json!(max);
                }
                json!({"type": "CUSTOM", "name": "progress", "value": value}).to_string()
            })
            .collect()
    }

    /// Auto mode: the round the stream follows ended and the session goes
    /// on with `next_run`. Ends what the round opened (as its end would),
    /// reports its progress, and follows the next round, all within the
    /// one AG-UI run.
    pub(super) fn next_round(&mut self, auto: &AutoRecord, next_run: &str) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(child) = self.open_children.last().cloned() {
            self.finish_child(&child, None, &mut out);
        }
        if let Some(root) = self.runs.get_mut(&self.root) {
            root.end_step(&mut out);
        }
        let mut texts: Vec<String> = out.into_iter().map(|v| v.to_string()).collect();
        texts.extend(Self::progress(auto, &self.root));
        self.root = next_run.to_owned();
        self.runs = HashMap::from([(next_run.to_owned(), Run::new(None, None))]);
        texts
    }

    /// Auto mode: the round the stream follows is the session's last. Its
    /// progress (the stop condition last) goes out now; `RUN_FINISHED`'s
    /// result will carry the session's end.
    pub(super) fn last_round(&mut self, auto: &AutoRecord) -> Vec<String> {
        self.session_end = Some(auto.clone());
        Self::progress(auto, &self.root)
    }

    /// A translator for the AG-UI run `run_id` that carries the parked
    /// Rein run `root` on from its park: `before` (the root's log up to
    /// and with its `run_parked`) tells it the tree so far; the sub-agents
    /// that were suspended start again when [`start`](Self::start) does.
    pub(super) fn resuming(
        thread_id: &str,
        run_id: &str,
        root: &str,
        before: &[AgentEvent],
    ) -> Self {
        let mut translator = Self::new(thread_id, run_id);
        translator.root = root.to_owned();
        translator.runs = HashMap::from([(root.to_owned(), Run::new(None, None))]);
        for event in before {
            if matches!(event, AgentEvent::RunParked { .. }) {
                continue;
            }
            translator.translate(event);
        }
        translator.emitted.clear();
        translator.interrupts.clear();
        for run in translator.runs.values_mut() {
            run.interrupts.clear();
            run.step = None;
            run.text = None;
        }
        translator
    }

    /// Whether the stream ended on an interrupt (the run is parked, not
    /// over: dropping the stream must not cancel it).
    pub(super) fn suspended(&self) -> bool {
        self.suspended
    }

    /// Whether `RUN_FINISHED` (or `RUN_ERROR`) was sent.
    pub(super) fn done(&self) -> bool {
        self.done
    }

    /// `RUN_STARTED`, and a resumed stream's suspended sub-agents again.
    pub(super) fn start(&self) -> Vec<String> {
        let mut out = vec![
            json!({"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id})
                .to_string(),
        ];
        for child in &self.open_children {
            let Some(run) = self.runs.get(child) else {
                continue;
            };
            let mut started = json!({"type": "SUBAGENT_STARTED", "subagentRunId": child, "name": run.agent.clone().unwrap_or_default()});
            if let Some(parent) = run.parent.as_deref().and_then(|p| self.runs.get(p))
                && let Some(tag) = &parent.tag
            {
                started["parentSubagentRunId"] = json!(tag);
            }
            if let Some(call) = &run.parent_call {
                started["parentToolCallId"] = json!(call);
            }
            out.push(started.to_string());
        }
        out
    }

    /// The ids of the messages and tool calls emitted since the last call
    /// (the sub-agents' too: a client sends them back with the
    /// conversation, and they are not the root thread's to append).
    pub(super) fn take_emitted_ids(&mut self) -> Vec<String> {
        std::mem::take(&mut self.emitted)
    }

    /// Ends sub-agent `child`'s segment of the stream while it is parked
    /// (or runs on beside a parked one): its open message and step, then
    /// `SUBAGENT_FINISHED {outcome: {type: "suspended", interruptIds}}`.
    /// It stays known, so a resumed stream starts it again.
    fn suspend_child(&mut self, child: &str, out: &mut Vec<Value>) {
        self.open_children.retain(|id| id != child);
        let Some(run) = self.runs.get_mut(child) else {
            return;
        };
        run.end_step(out);
        let ids = std::mem::take(&mut run.interrupts);
        out.push(json!({
            "type": "SUBAGENT_FINISHED", "subagentRunId": child,
            "outcome": {"type": "suspended", "interruptIds": ids},
        }));
    }

    /// Ends sub-agent `child`: first its own open sub-agents (latest
    /// first), then its open message and step, then `SUBAGENT_FINISHED`
    /// or `SUBAGENT_ERROR`. `termination` is `None` when the root ended
    /// without the child's end having been reported.
    fn finish_child(
        &mut self,
        child: &str,
        termination: Option<&TerminationReason>,
        out: &mut Vec<Value>,
    ) {
        let grandchildren: Vec<String> = self
            .open_children
            .iter()
            .rev()
            .filter(|id| self.runs.get(*id).and_then(|r| r.parent.as_deref()) == Some(child))
            .cloned()
            .collect();
        for grandchild in grandchildren {
            self.finish_child(&grandchild, None, out);
        }
        self.open_children.retain(|id| id != child);
        let Some(mut run) = self.runs.remove(child) else {
            return;
        };
        run.end_step(out);
        out.push(match termination {
            Some(TerminationReason::Error(message)) => json!({
                "type": "SUBAGENT_ERROR", "subagentRunId": child, "message": message, "code": "error",
            }),
            Some(termination) => {
                let mut result = termination_result(termination);
                result["response"] = json!(if run.response.is_empty() {
                    run.last_text
                } else {
                    run.response
                });
                if !run.outputs.is_empty() {
                    result["outputs"] = json!(run.outputs);
                }
                json!({"type": "SUBAGENT_FINISHED", "subagentRunId": child, "result": result})
            }
            None => json!({
                "type": "SUBAGENT_ERROR", "subagentRunId": child,
                "message": "the run ended before this sub-agent reported its end",
                "code": "unfinished",
            }),
        });
    }

    /// The AG-UI events for one of the run's (or a descendant's) events.
    pub(super) fn translate(&mut self, event: &AgentEvent) -> Vec<String> {
        if self.done {
            return Vec::new();
        }
        let mut out = Vec::new();
        let run_id = event.run_id();
        match event {
            AgentEvent::SubagentStarted {
                call_id,
                child_run_id,
                agent_id,
                ..
            } => {
                // A child of a run this stream follows, started once.
                if let Some(parent) = self.runs.get(run_id)
                    && !self.runs.contains_key(child_run_id)
                {
                    let mut started = json!({
                        "type": "SUBAGENT_STARTED",
                        "subagentRunId": child_run_id,
                        "name": agent_id,
                        "parentToolCallId": parent.tool_call_id(call_id),
                    });
                    if let Some(tag) = &parent.tag {
                        started["parentSubagentRunId"] = json!(tag);
                    }
                    out.push(started);
                    let mut child = Run::new(Some(child_run_id.clone()), Some(run_id.to_owned()));
                    child.agent = Some(agent_id.clone());
                    child.parent_call = Some(parent.tool_call_id(call_id));
                    self.runs.insert(child_run_id.clone(), child);
                    self.open_children.push(child_run_id.clone());
                }
            }
            AgentEvent::SubagentFinished {
                child_run_id,
                termination,
                ..
            } => {
                if self.open_children.contains(child_run_id) {
                    self.finish_child(child_run_id, Some(termination), &mut out);
                }
            }
            AgentEvent::ApprovalRequested {
                call_id,
                tool,
                arguments,
                kind,
                expires_at,
                ..
            } => {
                if let Some(run) = self.runs.get_mut(run_id) {
                    let id = run.tool_call_id(call_id);
                    let mut interrupt = interrupt(&id, tool, arguments, *kind);
                    // An escalation holds no tool call.
                    if *kind != PendingKind::Escalation {
                        run.announce_call(call_id, tool, arguments, &mut self.emitted, &mut out);
                        run.announced.insert(call_id.clone());
                        interrupt["toolCallId"] = json!(id);
                    }
                    run.interrupts.push(id.clone());
                    if let Some(at) = expires_at {
                        interrupt["expiresAt"] = json!(at);
                    }
                    if let Some(tag) = &run.tag {
                        interrupt["subagentRunId"] = json!(tag);
                    }
                    self.interrupts.push(interrupt);
                }
            }
            AgentEvent::RunParked { .. } if self.runs.contains_key(run_id) => {
                // The stream ends here: the run waits for the resume.
                while let Some(child) = self.open_children.last().cloned() {
                    self.suspend_child(&child, &mut out);
                }
                if let Some(root) = self.runs.get_mut(&self.root) {
                    root.end_step(&mut out);
                    root.interrupts.clear();
                }
                self.done = true;
                self.suspended = true;
                out.push(json!({
                    "type": "RUN_FINISHED", "threadId": self.thread_id, "runId": self.run_id,
                    "outcome": {"type": "interrupt", "interrupts": std::mem::take(&mut self.interrupts)},
                }));
            }
            AgentEvent::RunFinished { termination, .. } if run_id == self.root => {
                // Every sub-agent still open ends first, latest first.
                while let Some(child) = self.open_children.last().cloned() {
                    self.finish_child(&child, None, &mut out);
                }
                if let Some(root) = self.runs.get_mut(run_id) {
                    root.end_step(&mut out);
                }
                self.done = true;
                out.push(match termination {
                    TerminationReason::Error(message) => {
                        json!({"type": "RUN_ERROR", "message": message, "code": "error"})
                    }
                    other => {
                        let mut result = termination_result(other);
                        if let Some(end) = &self.session_end {
                            result["session_id"] = json!(end.session_id);
                            result["rounds"] = json!(end.round);
                            result["tokens_used_session"] = json!(end.tokens_used_session);
                            if let Some(max) = end.max_tokens {
                                result["max_tokens"] = json!(max);
                            }
                            if let Some(reason) = &end.stop_reason {
                                result["stop_reason"] = json!(reason);
                            }
                        }
                        let mut finished = json!({"type": "RUN_FINISHED", "threadId": self.thread_id, "runId": self.run_id, "result": result});
                        if *other == TerminationReason::Cancelled {
                            finished["outcome"] = json!({"type": "cancelled"});
                        }
                        finished
                    }
                });
            }
            // The root's plan is the run's AG-UI state `{ "plan": … }`: the
            // first change a snapshot, the later ones a JSON Patch.
            AgentEvent::PlanUpdated { plan, .. } if run_id == self.root => {
                out.push(if self.state_sent {
                    json!({"type": "STATE_DELTA", "delta": [{"op": "replace", "path": "/plan", "value": plan}]})
                } else {
                    self.state_sent = true;
                    json!({"type": "STATE_SNAPSHOT", "snapshot": {"plan": plan}})
                });
            }
            // A sub-agent's own end: its message and step end; the rest
            // is told by its SUBAGENT_* (on `subagent_finished`).
            AgentEvent::RunFinished {
                response, outputs, ..
            } => {
                if let Some(child) = self.runs.get_mut(run_id) {
                    child.end_step(&mut out);
                    child.response.clone_from(response);
                    child.outputs.clone_from(outputs);
                }
            }
            other => {
                if let Some(run) = self.runs.get_mut(run_id) {
                    run.translate(run_id, other, &mut self.emitted, &mut out);
                }
            }
        }
        out.into_iter().map(|v| v.to_string()).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use rein::contract::message::TokenUsage;
    use serde_json::{Value, json};

    use super::*;

    const T: &str = "th";

    fn text(run: &str, delta: &str) -> AgentEvent {
        AgentEvent::TextDelta {
            run_id: run.into(),
            thread_id: T.into(),
            delta: delta.into(),
        }
    }

    fn step(run: &str, step: u32) -> AgentEvent {
        AgentEvent::StepStarted {
            run_id: run.into(),
            thread_id: T.into(),
            step,
        }
    }

    fn call(run: &str, id: &str, name: &str) -> AgentEvent {
        AgentEvent::ToolCallStarted {
            run_id: run.into(),
            thread_id: T.into(),
            call_id: id.into(),
            name: name.into(),
            arguments: json!({"task": "t"}),
        }
    }

    fn result(run: &str, id: &str, name: &str) -> AgentEvent {
        AgentEvent::ToolCallFinished {
            run_id: run.into(),
            thread_id: T.into(),
            call_id: id.into(),
            name: name.into(),
            result: "{}".into(),
            is_error: false,
        }
    }

    fn started(parent: &str, call_id: &str, child: &str, agent: &str) -> AgentEvent {
        AgentEvent::SubagentStarted {
            run_id: parent.into(),
            thread_id: T.into(),
            call_id: call_id.into(),
            child_run_id: child.into(),
            child_thread_id: format!("{T}:{call_id}"),
            agent_id: agent.into(),
        }
    }

    fn run_started(run: &str) -> AgentEvent {
        AgentEvent::RunStarted {
            run_id: run.into(),
            thread_id: T.into(),
            agent_id: "a".into(),
        }
    }

    fn run_finished(run: &str, termination: TerminationReason, response: &str) -> AgentEvent {
        AgentEvent::RunFinished {
            run_id: run.into(),
            thread_id: T.into(),
            termination,
            response: response.into(),
            cancel_cause: None,
            steps: 1,
            usage: TokenUsage::default(),
            cache_usage: None,
            outputs: BTreeMap::new(),
            report: None,
        }
    }

    fn finished(parent: &str, call_id: &str, child: &str, t: TerminationReason) -> AgentEvent {
        AgentEvent::SubagentFinished {
            run_id: parent.into(),
            thread_id: T.into(),
            call_id: call_id.into(),
            child_run_id: child.into(),
            termination: t,
        }
    }

    /// Translates `events` after `RUN_STARTED`, checking the client
    /// verifier's rules as it goes: what is continued or ended is open
    /// and has the same owner; a sub-agent's events come between its
    /// start and end; everything a sub-agent (or the run) started is
    /// ended by its end; nothing after the run's end.
    fn translate(events: &[AgentEvent]) -> Vec<Value> {
        let mut translator = Translator::new(T, "root");
        let mut out: Vec<Value> = translator
            .start()
            .iter()
            .map(|s| serde_json::from_str(s).unwrap())
            .collect();
        for event in events {
            for s in translator.translate(event) {
                out.push(serde_json::from_str(&s).unwrap());
            }
        }
        check(&out);
        out
    }

    fn check(events: &[Value]) {
        // (kind, id) -> owner, for what is open.
        let mut open: HashMap<(&str, String), Option<String>> = HashMap::new();
        let mut subagents: HashSet<String> = HashSet::new();
        let mut ended = false;
        for e in events {
            assert!(!ended, "an event after the run's end: {e}");
            let kind = e["type"].as_str().unwrap();
            let owner = e
                .get("subagentRunId")
                .and_then(Value::as_str)
                .map(str::to_owned);
            if let Some(tag) = &owner
                && !kind.starts_with("SUBAGENT_")
            {
                assert!(subagents.contains(tag), "{e} outside its sub-agent");
            }
            let key = |field: &str| e[field].as_str().unwrap().to_owned();
            match kind {
                "TEXT_MESSAGE_START" => {
                    assert!(open.insert(("m", key("messageId")), owner).is_none(), "{e}");
                }
                "TEXT_MESSAGE_CONTENT" => {
                    assert_eq!(open.get(&("m", key("messageId"))), Some(&owner), "{e}");
                }
                "TEXT_MESSAGE_END" => {
                    assert_eq!(open.remove(&("m", key("messageId"))), Some(owner), "{e}");
                }
                "TOOL_CALL_START" => {
                    assert!(
                        open.insert(("t", key("toolCallId")), owner).is_none(),
                        "{e}"
                    );
                }
                "TOOL_CALL_ARGS" => {
                    assert_eq!(open.get(&("t", key("toolCallId"))), Some(&owner), "{e}");
                }
                "TOOL_CALL_END" => {
                    assert_eq!(open.remove(&("t", key("toolCallId"))), Some(owner), "{e}");
                }
                "STEP_STARTED" => {
                    let name = format!("{owner:?}/{}", key("stepName"));
                    assert!(open.insert(("s", name), owner).is_none(), "{e}");
                }
                "STEP_FINISHED" => {
                    let name = format!("{owner:?}/{}", key("stepName"));
                    assert_eq!(open.remove(&("s", name)), Some(owner), "{e}");
                }
                "SUBAGENT_STARTED" => {
                    let id = key("subagentRunId");
                    if let Some(parent) = e.get("parentSubagentRunId").and_then(Value::as_str) {
                        assert!(subagents.contains(parent), "{e}");
                    }
                    assert!(subagents.insert(id), "{e}");
                }
                "SUBAGENT_FINISHED" | "SUBAGENT_ERROR" => {
                    let id = key("subagentRunId");
                    assert!(subagents.remove(&id), "{e}");
                    let left: Vec<_> = open
                        .iter()
                        .filter(|(_, o)| o.as_deref() == Some(id.as_str()))
                        .collect();
                    assert!(left.is_empty(), "{e} with {left:?} still open");
                }
                "RUN_FINISHED" | "RUN_ERROR" => {
                    assert!(open.is_empty(), "{e} with {open:?} still open");
                    assert!(subagents.is_empty(), "{e} with {subagents:?} still open");
                    ended = true;
                }
                "RUN_STARTED" | "TOOL_CALL_RESULT" => {}
                other => panic!("unexpected {other}"),
            }
        }
        assert!(ended, "the run never ended");
    }

    fn of_kind<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
        events.iter().filter(|e| e["type"] == kind).collect()
    }

    #[test]
    fn concurrent_children_interleave_each_under_its_own_id_and_a_grandchild_names_its_parent() {
        let events = translate(&[
            run_started("root"),
            step("root", 1),
            text("root", "Asking both."),
            call("root", "call_1", "research"),
            call("root", "call_2", "research"),
            started("root", "call_1", "c1", "researcher"),
            started("root", "call_2", "c2", "researcher"),
            run_started("c1"),
            run_started("c2"),
            step("c1", 1),
            step("c2", 1),
            text("c1", "alpha "),
            text("c2", "beta "),
            // c1 calls its own sub-agent with the same call id as the root's.
            call("c1", "call_1", "clerk"),
            text("c2", "more"),
            started("c1", "call_1", "g1", "clerk"),
            run_started("g1"),
            step("g1", 1),
            text("g1", "filed"),
            run_finished("g1", TerminationReason::NaturalEnd, "filed"),
            finished("c1", "call_1", "g1", TerminationReason::NaturalEnd),
            result("c1", "call_1", "clerk"),
            run_finished("c2", TerminationReason::NaturalEnd, "beta more"),
            finished("root", "call_2", "c2", TerminationReason::NaturalEnd),
            step("c1", 2),
            text("c1", "alpha done"),
            run_finished("c1", TerminationReason::NaturalEnd, "alpha done"),
            finished("root", "call_1", "c1", TerminationReason::NaturalEnd),
            result("root", "call_1", "research"),
            result("root", "call_2", "research"),
            step("root", 2),
            text("root", "All done."),
            run_finished("root", TerminationReason::NaturalEnd, "All done."),
        ]);
        // No run events but the root's.
        assert_eq!(of_kind(&events, "RUN_STARTED").len(), 1);
        assert_eq!(of_kind(&events, "RUN_FINISHED").len(), 1);
        let starts = of_kind(&events, "SUBAGENT_STARTED");
        assert_eq!(
            starts
                .iter()
                .map(|e| {
                    (
                        e["subagentRunId"].as_str().unwrap(),
                        e["parentToolCallId"].as_str().unwrap(),
                        e.get("parentSubagentRunId").and_then(Value::as_str),
                        e["name"].as_str().unwrap(),
                    )
                })
                .collect::<Vec<_>>(),
            vec![
                ("c1", "call_1", None, "researcher"),
                ("c2", "call_2", None, "researcher"),
                ("g1", "c1:call_1", Some("c1"), "clerk"),
            ]
        );
        // The children's text interleaves, each message under its run.
        let texts: Vec<(&str, Option<&str>)> = of_kind(&events, "TEXT_MESSAGE_CONTENT")
            .iter()
            .map(|e| {
                (
                    e["delta"].as_str().unwrap(),
                    e.get("subagentRunId").and_then(Value::as_str),
                )
            })
            .collect();
        assert_eq!(
            texts,
            vec![
                ("Asking both.", None),
                ("alpha ", Some("c1")),
                ("beta ", Some("c2")),
                ("more", Some("c2")),
                ("filed", Some("g1")),
                ("alpha done", Some("c1")),
                ("All done.", None),
            ]
        );
        // c1's tool call is its own, under its own id.
        let c1_call = of_kind(&events, "TOOL_CALL_START")
            .into_iter()
            .find(|e| e["subagentRunId"] == "c1")
            .unwrap();
        assert_eq!(c1_call["toolCallId"], "c1:call_1");
        assert!(
            c1_call["parentMessageId"]
                .as_str()
                .unwrap()
                .starts_with("c1-m")
        );
        let ends = of_kind(&events, "SUBAGENT_FINISHED");
        let order: Vec<&str> = ends
            .iter()
            .map(|e| e["subagentRunId"].as_str().unwrap())
            .collect();
        assert_eq!(order, vec!["g1", "c2", "c1"]);
        assert_eq!(
            ends[2]["result"],
            json!({"termination": {"type": "natural_end"}, "response": "alpha done"})
        );
        assert!(ends.iter().all(|e| e.get("outcome").is_none()));
    }

    #[test]
    fn an_erroring_child_is_a_subagent_error_and_the_root_goes_on() {
        let events = translate(&[
            step("root", 1),
            call("root", "call_1", "research"),
            started("root", "call_1", "c1", "researcher"),
            run_started("c1"),
            step("c1", 1),
            text("c1", "half an ans"),
            run_finished("c1", TerminationReason::Error("model exploded".into()), ""),
            finished(
                "root",
                "call_1",
                "c1",
                TerminationReason::Error("model exploded".into()),
            ),
            result("root", "call_1", "research"),
            step("root", 2),
            text("root", "It failed."),
            run_finished("root", TerminationReason::NaturalEnd, "It failed."),
        ]);
        let error = of_kind(&events, "SUBAGENT_ERROR");
        assert_eq!(
            *error[0],
            json!({"type": "SUBAGENT_ERROR", "subagentRunId": "c1", "message": "model exploded", "code": "error"})
        );
        assert!(of_kind(&events, "SUBAGENT_FINISHED").is_empty());
        assert_eq!(events.last().unwrap()["type"], "RUN_FINISHED");
    }

    #[test]
    fn a_child_that_fails_to_start_still_ends() {
        translate(&[
            step("root", 1),
            call("root", "call_1", "research"),
            started("root", "call_1", "c1", "researcher"),
            finished(
                "root",
                "call_1",
                "c1",
                TerminationReason::Error("no such agent".into()),
            ),
            run_finished("root", TerminationReason::NaturalEnd, ""),
        ]);
    }

    #[test]
    fn a_root_cancelled_mid_tree_ends_every_open_child_before_run_finished() {
        // The children's ends are not reported: the translator ends them.
        let events = translate(&[
            step("root", 1),
            call("root", "call_1", "research"),
            started("root", "call_1", "c1", "researcher"),
            step("c1", 1),
            call("c1", "call_1", "clerk"),
            started("c1", "call_1", "g1", "clerk"),
            step("g1", 1),
            text("g1", "half"),
            run_finished("root", TerminationReason::Cancelled, ""),
            text("g1", "after the end"),
        ]);
        let ends: Vec<&str> = of_kind(&events, "SUBAGENT_ERROR")
            .iter()
            .map(|e| e["subagentRunId"].as_str().unwrap())
            .collect();
        assert_eq!(ends, vec!["g1", "c1"]);
        let last = events.last().unwrap();
        assert_eq!(last["outcome"], json!({"type": "cancelled"}));

        // Reported ends (the runtime's order): cancelled children finish.
        let events = translate(&[
            step("root", 1),
            call("root", "call_1", "research"),
            started("root", "call_1", "c1", "researcher"),
            step("c1", 1),
            text("c1", "half"),
            run_finished("c1", TerminationReason::Cancelled, ""),
            finished("root", "call_1", "c1", TerminationReason::Cancelled),
            result("root", "call_1", "research"),
            run_finished("root", TerminationReason::Cancelled, ""),
        ]);
        let end = of_kind(&events, "SUBAGENT_FINISHED");
        assert_eq!(
            end[0]["result"],
            json!({"termination": {"type": "cancelled"}, "response": "half"})
        );
    }

    #[test]
    fn child_message_and_tool_call_ids_are_remembered_too() {
        let mut translator = Translator::new(T, "root");
        for event in [
            step("root", 1),
            call("root", "call_1", "research"),
            started("root", "call_1", "c1", "researcher"),
            step("c1", 1),
            text("c1", "hi"),
            call("c1", "call_1", "x"),
            result("c1", "call_1", "x"),
        ] {
            translator.translate(&event);
        }
        assert_eq!(
            translator.take_emitted_ids(),
            vec!["call_1", "c1-m1", "c1:call_1", "c1-m2"]
        );
    }
}
