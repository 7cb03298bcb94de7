//! Rein's run events as AG-UI events.
//!
//! **Invariant:** every message, tool call and step this translator starts
//! it also ends before `RUN_FINISHED`/`RUN_ERROR`, and it emits nothing
//! after those.

use rein::TerminationReason;
use rein::events::AgentEvent;
use serde_json::{Value, json};

/// Turns one run's events into AG-UI event JSON texts.
pub(super) struct Translator {
    thread_id: String,
    run_id: String,
    next_id: u64,
    /// The open text message.
    text: Option<String>,
    /// The step's last text message (the parent of its tool calls).
    parent: Option<String>,
    /// The open step's name.
    step: Option<String>,
    /// Message ids emitted since the last `take_emitted_ids`.
    emitted: Vec<String>,
    done: bool,
}

impl Translator {
    pub(super) fn new(thread_id: &str, run_id: &str) -> Self {
        Self {
            thread_id: thread_id.to_owned(),
            run_id: run_id.to_owned(),
            next_id: 0,
            text: None,
            parent: None,
            step: None,
            emitted: Vec::new(),
            done: false,
        }
    }

    /// `RUN_STARTED`.
    pub(super) fn start(&self) -> Vec<String> {
        vec![
            json!({"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id})
                .to_string(),
        ]
    }

    /// The ids of the messages emitted since the last call.
    pub(super) fn take_emitted_ids(&mut self) -> Vec<String> {
        std::mem::take(&mut self.emitted)
    }

    fn message_id(&mut self) -> String {
        self.next_id += 1;
        let id = format!("{}-m{}", self.run_id, self.next_id);
        self.emitted.push(id.clone());
        id
    }

    fn end_text(&mut self, out: &mut Vec<Value>) {
        if let Some(id) = self.text.take() {
            out.push(json!({"type": "TEXT_MESSAGE_END", "messageId": id}));
        }
    }

    fn end_step(&mut self, out: &mut Vec<Value>) {
        self.end_text(out);
        if let Some(name) = self.step.take() {
            out.push(json!({"type": "STEP_FINISHED", "stepName": name}));
        }
        self.parent = None;
    }

    fn start_step(&mut self, name: String, out: &mut Vec<Value>) {
        self.end_step(out);
        out.push(json!({"type": "STEP_STARTED", "stepName": name}));
        self.step = Some(name);
    }

    /// The AG-UI events for one of the run's events.
    pub(super) fn translate(&mut self, event: &AgentEvent) -> Vec<String> {
        if self.done {
            return Vec::new();
        }
        let mut out = Vec::new();
        match event {
            AgentEvent::StepStarted { step, .. } => {
                self.start_step(format!("step {step}"), &mut out)
            }
            AgentEvent::RetryStarted { step, attempt, .. } => {
                self.start_step(format!("step {step} (attempt {attempt})"), &mut out);
            }
            AgentEvent::TextDelta { delta, .. } if !delta.is_empty() => {
                let id = match &self.text {
                    Some(id) => id.clone(),
                    None => {
                        let id = self.message_id();
                        out.push(json!({"type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant"}));
                        self.text = Some(id.clone());
                        self.parent = Some(id.clone());
                        id
                    }
                };
                out.push(json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": delta}));
            }
            AgentEvent::ToolCallStarted {
                call_id,
                name,
                arguments,
                ..
            } => {
                self.end_text(&mut out);
                self.emitted.push(call_id.clone());
                let mut start =
                    json!({"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": name});
                if let Some(parent) = &self.parent {
                    start["parentMessageId"] = json!(parent);
                }
                out.push(start);
                out.push(json!({"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": arguments.to_string()}));
                out.push(json!({"type": "TOOL_CALL_END", "toolCallId": call_id}));
            }
            AgentEvent::ToolCallFinished {
                call_id, result, ..
            } => {
                let id = self.message_id();
                out.push(json!({"type": "TOOL_CALL_RESULT", "messageId": id, "toolCallId": call_id, "content": result, "role": "tool"}));
            }
            AgentEvent::RunFinished { termination, .. } => {
                self.end_step(&mut out);
                self.done = true;
                out.push(match termination {
                    TerminationReason::Error(message) => {
                        json!({"type": "RUN_ERROR", "message": message, "code": "error"})
                    }
                    other => {
                        let mut result = json!({"termination": other});
                        if let TerminationReason::Stopped(reason) = other {
                            result["stop_code"] = json!(reason.code);
                            result["stop_detail"] = json!(reason.detail);
                        }
                        let mut finished = json!({"type": "RUN_FINISHED", "threadId": self.thread_id, "runId": self.run_id, "result": result});
                        if *other == TerminationReason::Cancelled {
                            finished["outcome"] = json!({"type": "cancelled"});
                        }
                        finished
                    }
                });
            }
            _ => {}
        }
        out.into_iter().map(|v| v.to_string()).collect()
    }
}
