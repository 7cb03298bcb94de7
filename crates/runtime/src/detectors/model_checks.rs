//! The detectors a model judges: `llm_loop_check` (is the run stuck?) and
//! `task_complete` (is the user's task done?).
//!
//! Each keeps when it is due, builds the request its model reads (a fixed
//! system instruction, the user's task and the [`recent`] history as a
//! [`transcript`], a JSON schema for the answer), validates the answer and
//! turns it into a [`Verdict`] on its ladder. Sending the request, paying
//! for it and acting on the verdict is the agent loop's
//! (`agent_loop::model_checks`).
//!
//! # When a check is due
//!
//! Both are judged after a round is stored.
//!
//! - `llm_loop_check`, as Gemini CLI's third layer does it: after a round
//!   with tool calls, first once the run has made `after_rounds` rounds,
//!   then every `interval` rounds. Each answer sets the next interval from its confidence
//!   `c`: `round(min_interval + (max_interval - min_interval) × (1 − c))`,
//!   so a run that looks more stuck is checked more often. A failed check
//!   leaves the interval as it was.
//! - `task_complete`: after every final answer (one without tool calls)
//!   that nothing else answered (no stop, nudge or other round requested),
//!   and, with `every`, after every `every`-th round with tool calls.
//!
//! Both stop checking after `max_checks` checks (sent or failed) in a run.
//!
//! [`recent`]: crate::history
//! [`transcript`]: crate::history

use std::sync::{Arc, LazyLock};

use futures::StreamExt;
use rein_runtime_contract::escalation::{EscalationAction, EscalationStep, Ladder};
use rein_runtime_contract::inference::{
    InferenceError, InferenceErrorKind, InferenceRequest, InferenceResponse, LlmExecutor,
    ResponseFormat,
};
use rein_runtime_contract::lifecycle::{StopConditionSpec, StoppedReason};
use rein_runtime_contract::message::{Message, Role};
use rein_runtime_contract::spec::ModelSpec;
use serde_json::{Value, json};

use super::{Escalation, Verdict};
use crate::history::{recent, transcript};

/// The system instruction of an `llm_loop_check`.
pub const LOOP_CHECK_INSTRUCTION: &str = "You review the work of an AI assistant that calls tools in a loop, and decide whether it is stuck: repeating the same actions with the same outcomes, or restating the same plan without acting, while making no progress toward the user's request.

It is stuck only when both hold: the same pattern has repeated over several consecutive assistant actions, and those repetitions changed nothing. Look at the arguments of each tool call, not only its name.

It is NOT stuck when it does the same kind of action on different targets (other files, other records, other queries), edits different parts of the same thing, gathers information step by step, or retries a failed action with changed arguments. When the user's request asks for many similar steps (\"every file\", \"each item\"), repeated calls with different arguments are the expected work.

Answer only with a JSON object: {\"reasoning\": \"<why>\", \"confidence\": <a number from 0 to 1 that the assistant is stuck>}.";

/// The question an `llm_loop_check` asks after the history.
pub const LOOP_CHECK_QUESTION: &str = "Is the assistant stuck in an unproductive loop? Weigh the user's request when repeated calls could be legitimate batch work. Answer with the JSON object.";

/// The system instruction of a `task_complete` check.
pub const COMPLETION_INSTRUCTION: &str = "You review the work of an AI assistant and decide whether the user's task is complete: everything the user asked for has been done or answered, not merely planned, promised or partly done.

Judge from the conversation only. A question the assistant asks back, a plan of next steps, or an answer that covers part of the request means the task is not complete.

Answer only with a JSON object: {\"reasoning\": \"<why>\", \"complete\": <true or false>, \"confidence\": <a number from 0 to 1 in that verdict>}.";

/// The question a `task_complete` check asks after the history.
pub const COMPLETION_QUESTION: &str = "Is the user's task complete? Answer with the JSON object.";

/// The nudge of an `llm_loop_check` detection; the model's reasoning
/// follows it.
pub const LLM_LOOP_NUDGE: &str = "A reviewer judged that you are repeating the same actions without making progress. Stop and reconsider: try a different approach, or answer with what you have.";

/// The nudge of a final answer judged incomplete; the judge's reasoning
/// follows it.
pub const TASK_INCOMPLETE_NUDGE: &str = "A reviewer judged that the task is not complete yet. Continue working on it, and answer when all of it is done.";

/// The most characters of one message (or call's arguments) a judging
/// model reads.
const MAX_MESSAGE_CHARS: usize = 2_000;

/// The answer tokens a check asks for when its model sets no
/// `max_output_tokens`.
pub(crate) const DEFAULT_CHECK_OUTPUT_TOKENS: u32 = 512;

static LOOP_SCHEMA: LazyLock<Arc<Value>> = LazyLock::new(|| {
    Arc::new(json!({
        "type": "object",
        "properties": {
            "reasoning": { "type": "string" },
            "confidence": { "type": "number", "minimum": 0, "maximum": 1 }
        },
        "required": ["reasoning", "confidence"],
        "additionalProperties": false
    }))
});

static COMPLETION_SCHEMA: LazyLock<Arc<Value>> = LazyLock::new(|| {
    Arc::new(json!({
        "type": "object",
        "properties": {
            "reasoning": { "type": "string" },
            "complete": { "type": "boolean" },
            "confidence": { "type": "number", "minimum": 0, "maximum": 1 }
        },
        "required": ["reasoning", "complete", "confidence"],
        "additionalProperties": false
    }))
});

/// What a judging model answered, validated.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Answer {
    pub(crate) reasoning: String,
    pub(crate) confidence: f64,
    /// `task_complete` only.
    pub(crate) complete: Option<bool>,
}

/// What a check came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A detection (acted on through the ladder, or a completion stop).
    Detected,
    /// Nothing to act on.
    Clear,
    /// An error or malformed output: skipped.
    Failed,
    /// The budget could not pay for it: not sent.
    Skipped,
}

impl Outcome {
    /// The outcome's name in the `model_check` event.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Detected => "detected",
            Self::Clear => "clear",
            Self::Failed => "failed",
            Self::Skipped => "skipped",
        }
    }
}

/// What each kind of check watches for.
#[derive(Debug)]
enum Kind {
    Loop {
        after_rounds: u32,
        interval: u32,
        min_interval: u32,
        max_interval: u32,
        /// The round of the last check, once one was made.
        last_check: Option<u32>,
    },
    Completion {
        every: u32,
    },
}

/// One model-judged condition of a run (see the [module docs](self)).
#[derive(Debug)]
pub(crate) struct ModelCheck {
    kind: Kind,
    /// Its position among the agent's model checks (and their routes).
    pub(crate) index: usize,
    threshold: f64,
    history: usize,
    max_checks: usize,
    made: usize,
    escalation: Escalation,
}

impl ModelCheck {
    /// The model checks of `specs` in list order, each with its ladder
    /// from `escalation` (by code) when one is given.
    pub(crate) fn all(
        specs: &[StopConditionSpec],
        escalation: &std::collections::BTreeMap<String, Ladder>,
    ) -> Vec<Self> {
        let mut checks = Vec::new();
        for spec in specs {
            let index = checks.len();
            let check = match spec {
                StopConditionSpec::LlmLoopCheck {
                    after_rounds,
                    interval,
                    min_interval,
                    max_interval,
                    threshold,
                    history,
                    max_checks,
                    on_detect,
                    ..
                } => Self {
                    kind: Kind::Loop {
                        after_rounds: to_u32(*after_rounds),
                        interval: to_u32(*interval),
                        min_interval: to_u32(*min_interval),
                        max_interval: to_u32(*max_interval),
                        last_check: None,
                    },
                    index,
                    threshold: threshold.0,
                    history: *history,
                    max_checks: *max_checks,
                    made: 0,
                    escalation: escalation
                        .get("llm_loop_check")
                        .cloned()
                        .map_or_else(|| Escalation::new(*on_detect), Escalation::with_ladder),
                },
                StopConditionSpec::TaskComplete {
                    every,
                    threshold,
                    history,
                    max_checks,
                    ..
                } => Self {
                    kind: Kind::Completion {
                        every: to_u32(*every),
                    },
                    index,
                    threshold: threshold.0,
                    history: *history,
                    max_checks: *max_checks,
                    made: 0,
                    escalation: Escalation::with_ladder(
                        escalation
                            .get("task_complete")
                            .cloned()
                            .unwrap_or_else(warn_only),
                    ),
                },
                _ => continue,
            };
            checks.push(check);
        }
        checks
    }

    /// The condition's code.
    pub(crate) fn code(&self) -> &'static str {
        match self.kind {
            Kind::Loop { .. } => "llm_loop_check",
            Kind::Completion { .. } => "task_complete",
        }
    }

    /// Whether a check is due after round `round` (`final_answer`: its
    /// answer called no tools).
    pub(crate) fn due(&self, round: u32, final_answer: bool) -> bool {
        if self.made >= self.max_checks {
            return false;
        }
        match self.kind {
            Kind::Loop {
                after_rounds,
                interval,
                last_check,
                ..
            } => {
                !final_answer
                    && match last_check {
                        None => round >= after_rounds,
                        Some(last) => round.saturating_sub(last) >= interval.max(1),
                    }
            }
            Kind::Completion { every } => {
                final_answer || (every > 0 && round.is_multiple_of(every))
            }
        }
    }

    /// The request for `model` after round `round` of a run whose history
    /// is `messages` and whose user's task is `task`. The loop check's
    /// interval counts from this round whether or not the check is sent
    /// ([`sent`](Self::sent) counts the checks sent).
    pub(crate) fn request(
        &mut self,
        round: u32,
        messages: &[Message],
        task: &str,
        model: &ModelSpec,
    ) -> InferenceRequest {
        if let Kind::Loop { last_check, .. } = &mut self.kind {
            *last_check = Some(round);
        }
        let (instruction, question, schema) = match self.kind {
            Kind::Loop { .. } => (LOOP_CHECK_INSTRUCTION, LOOP_CHECK_QUESTION, &LOOP_SCHEMA),
            Kind::Completion { .. } => (
                COMPLETION_INSTRUCTION,
                COMPLETION_QUESTION,
                &COMPLETION_SCHEMA,
            ),
        };
        let prompt = format!(
            "<user_request>\n{}\n</user_request>\n\n<recent_history>\n{}</recent_history>\n\n{question}",
            crate::detectors::snippet(task, MAX_MESSAGE_CHARS),
            transcript(recent(messages, self.history), Some(MAX_MESSAGE_CHARS)),
        );
        let mut request =
            InferenceRequest::new(model.upstream_model.clone(), vec![Message::user(prompt)])
                .with_system(instruction)
                .with_response_format(ResponseFormat::JsonSchema(Arc::clone(schema)));
        request.temperature = model.temperature;
        request.max_output_tokens = Some(
            model
                .max_output_tokens
                .unwrap_or(DEFAULT_CHECK_OUTPUT_TOKENS),
        );
        request
    }

    /// The check was sent (it counts toward `max_checks`, whatever came
    /// back).
    pub(crate) fn sent(&mut self) {
        self.made += 1;
    }

    /// Validates the model's answer `text`.
    ///
    /// # Errors
    ///
    /// What is wrong with it: not a JSON object, or a field missing or of
    /// the wrong type or range.
    pub(crate) fn parse(&self, text: &str) -> Result<Answer, String> {
        parse_answer(text, matches!(self.kind, Kind::Completion { .. }))
    }

    /// Acts on `answer` for round `round` (`final_answer`: its answer
    /// called no tools): the outcome, and the verdict when there is one.
    pub(crate) fn judge(
        &mut self,
        model_id: &str,
        answer: &Answer,
        final_answer: bool,
    ) -> (Outcome, Option<Verdict>) {
        let confident = answer.confidence >= self.threshold;
        match &mut self.kind {
            Kind::Loop {
                interval,
                min_interval,
                max_interval,
                ..
            } => {
                let span = f64::from(max_interval.saturating_sub(*min_interval));
                let next = f64::from(*min_interval) + span * (1.0 - answer.confidence);
                *interval = next.round().clamp(1.0, f64::from(u32::MAX)) as u32;
                if !confident {
                    return (Outcome::Clear, None);
                }
                let detail = judged(model_id, "the run stuck", answer, self.threshold);
                let nudge = format!(
                    "{LLM_LOOP_NUDGE} The reviewer's reasoning: {}",
                    answer.reasoning
                );
                let verdict = self.escalation.fire("llm_loop_check", detail, &nudge);
                (Outcome::Detected, Some(verdict))
            }
            Kind::Completion { .. } => match answer.complete {
                Some(true) if confident => {
                    let detail = judged(model_id, "the task complete", answer, self.threshold);
                    (
                        Outcome::Detected,
                        Some(Verdict::Stop(StoppedReason::new("task_complete", detail))),
                    )
                }
                Some(false) if confident && final_answer => {
                    let detail = judged(model_id, "the task incomplete", answer, self.threshold);
                    let nudge = format!(
                        "{TASK_INCOMPLETE_NUDGE} The reviewer's reasoning: {}",
                        answer.reasoning
                    );
                    let verdict = self.escalation.fire("task_incomplete", detail, &nudge);
                    (Outcome::Detected, Some(verdict))
                }
                _ => (Outcome::Clear, None),
            },
        }
    }
}

/// A detection's detail: what `model_id` judged, with its confidence and
/// reasoning.
fn judged(model_id: &str, what: &str, answer: &Answer, threshold: f64) -> String {
    format!(
        "model \"{model_id}\" judged {what} (confidence {:.2}, threshold {threshold}): {}",
        answer.confidence, answer.reasoning
    )
}

/// The ladder `[warn]`.
fn warn_only() -> Ladder {
    match Ladder::new(vec![EscalationStep::new(EscalationAction::Warn, 1)]) {
        Ok(ladder) => ladder,
        Err(_) => Ladder::from_on_detect(rein_runtime_contract::lifecycle::OnDetect::Stop),
    }
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Validates a judging model's answer (see [`ModelCheck::parse`]): the
/// JSON object in `text` (fences and text around it are ignored), with a
/// string `reasoning`, a `confidence` from 0 to 1 and, when `completion`,
/// a boolean `complete`.
pub(crate) fn parse_answer(text: &str, completion: bool) -> Result<Answer, String> {
    if !text.contains('{') {
        return Err(format!(
            "the answer holds no JSON object: {:?}",
            crate::detectors::snippet(text, 200)
        ));
    }
    // The first `{` that opens a whole JSON object (prose around it, or
    // braces in the prose before it, are skipped).
    let mut first_error = None;
    let mut object = None;
    for (at, _) in text.match_indices('{') {
        let mut values = serde_json::Deserializer::from_str(&text[at..]).into_iter::<Value>();
        match values.next() {
            Some(Ok(value @ Value::Object(_))) => {
                object = Some(value);
                break;
            }
            Some(Err(e)) => {
                first_error.get_or_insert_with(|| e.to_string());
            }
            _ => {}
        }
    }
    let object = object.ok_or_else(|| {
        format!(
            "the answer is not valid JSON: {}",
            first_error.unwrap_or_else(|| "no object".to_owned())
        )
    })?;
    let reasoning = object
        .get("reasoning")
        .and_then(Value::as_str)
        .ok_or_else(|| "`reasoning` is missing or not a string".to_owned())?;
    let confidence = object
        .get("confidence")
        .and_then(Value::as_f64)
        .filter(|c| (0.0..=1.0).contains(c))
        .ok_or_else(|| {
            format!(
                "`confidence` is missing or not a number from 0 to 1: {}",
                object.get("confidence").unwrap_or(&Value::Null)
            )
        })?;
    let complete = if completion {
        Some(
            object
                .get("complete")
                .and_then(Value::as_bool)
                .ok_or_else(|| "`complete` is missing or not a boolean".to_owned())?,
        )
    } else {
        None
    };
    Ok(Answer {
        reasoning: reasoning.to_owned(),
        confidence,
        complete,
    })
}

/// Sends a check's `request` to `executor` and reads the whole answer.
/// Two attempts, as Gemini CLI makes: after a refused request (an invalid
/// request or a server error) it goes again in JSON mode with the schema
/// alongside, for providers that refuse the JSON-schema response format.
///
/// # Cancel safety
///
/// Dropping the future drops the request in flight; nothing else is kept.
pub(crate) async fn ask(
    executor: &dyn LlmExecutor,
    request: &InferenceRequest,
) -> Result<InferenceResponse, InferenceError> {
    let first = match attempt(executor, request).await {
        Ok(response) => return Ok(response),
        // A limit, a timeout or an unreachable host would refuse JSON mode
        // too: only a refused request is tried again.
        Err(error)
            if !matches!(
                error.kind(),
                InferenceErrorKind::InvalidRequest | InferenceErrorKind::Server
            ) =>
        {
            return Err(error);
        }
        Err(first) => first,
    };
    let mut plain = request.clone();
    plain.response_format = plain
        .response_format
        .map(|f| ResponseFormat::JsonObject(Arc::new(f.schema().clone())));
    attempt(executor, &plain).await.map_err(|second| {
        InferenceError::new(
            second.kind(),
            format!(
                "{} (and with the response schema: {first})",
                second.message()
            ),
        )
    })
}

/// One inference, streamed to its end.
async fn attempt(
    executor: &dyn LlmExecutor,
    request: &InferenceRequest,
) -> Result<InferenceResponse, InferenceError> {
    let mut stream = executor.open(request).await?;
    let mut response = InferenceResponse::default();
    while let Some(delta) = stream.next().await {
        response.apply(delta?);
    }
    Ok(response)
}

/// The user's task in `messages`: the first user message from `from` on
/// (a run's input starts there), else the last one before it; empty if
/// none.
pub(crate) fn task_of(messages: &[Message], from: usize) -> &str {
    let from = from.min(messages.len());
    messages[from..]
        .iter()
        .find(|m| m.role == Role::User)
        .or_else(|| messages[..from].iter().rev().find(|m| m.role == Role::User))
        .map_or("", |m| m.content.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_in_fences_with_text_around_it_is_read() {
        let answer = parse_answer(
            "Sure.\n```json\n{\"reasoning\": \"same call\", \"confidence\": 0.95}\n```",
            false,
        );
        assert_eq!(
            answer,
            Ok(Answer {
                reasoning: "same call".to_owned(),
                confidence: 0.95,
                complete: None
            })
        );
    }

    #[test]
    fn malformed_answers_are_refused_with_what_is_wrong() {
        let cases = [
            ("no json here", "no JSON object"),
            ("{\"reasoning\": 1, \"confidence\": 0.5}", "`reasoning`"),
            (
                "{\"reasoning\": \"r\", \"confidence\": 1.5}",
                "`confidence`",
            ),
            (
                "{\"reasoning\": \"r\", \"confidence\": \"high\"}",
                "`confidence`",
            ),
            ("{\"reasoning\": \"r\" \"confidence\": 1}", "not valid JSON"),
        ];
        for (text, expected) in cases {
            let error = parse_answer(text, false).expect_err(text);
            assert!(error.contains(expected), "{text}: {error}");
        }
        let error = parse_answer("{\"reasoning\": \"r\", \"confidence\": 1}", true)
            .expect_err("completion needs `complete`");
        assert!(error.contains("`complete`"), "{error}");
    }

    fn loop_check(after_rounds: usize) -> ModelCheck {
        let spec = StopConditionSpec::LlmLoopCheck {
            model_id: "judge".into(),
            after_rounds,
            interval: 10,
            min_interval: 5,
            max_interval: 15,
            threshold: Default::default(),
            history: 20,
            max_checks: 3,
            on_detect: Default::default(),
        };
        ModelCheck::all(&[spec], &Default::default()).remove(0)
    }

    #[test]
    fn the_loop_check_waits_for_its_rounds_then_adapts_its_interval_to_the_confidence() {
        let model = ModelSpec::new("judge", "p", "m");
        let mut check = loop_check(30);
        assert!(!check.due(29, false));
        assert!(
            !check.due(30, true),
            "a final answer ends the run: no loop check"
        );
        assert!(check.due(30, false));
        let _ = check.request(30, &[Message::user("task")], "task", &model);
        check.sent();
        assert!(!check.due(39, false));
        assert!(check.due(40, false), "the first interval is 10");
        let low = Answer {
            reasoning: "different files".into(),
            confidence: 0.1,
            complete: None,
        };
        let _ = check.request(40, &[], "task", &model);
        check.sent();
        assert_eq!(check.judge("judge", &low, false), (Outcome::Clear, None));
        // round(5 + 10 × 0.9) = 14 rounds until the next check.
        assert!(!check.due(53, false));
        assert!(check.due(54, false));
        let high = Answer {
            reasoning: "same edit again".into(),
            confidence: 0.95,
            complete: None,
        };
        let _ = check.request(54, &[], "task", &model);
        check.sent();
        let (outcome, verdict) = check.judge("judge", &high, false);
        assert_eq!(outcome, Outcome::Detected);
        match verdict {
            Some(Verdict::Stop(reason)) => {
                assert_eq!(reason.code, "llm_loop_check");
                assert!(
                    reason.detail.contains("same edit again"),
                    "{}",
                    reason.detail
                );
            }
            other => panic!("{other:?}"),
        }
        // Three checks made: the cap.
        assert!(!check.due(1_000, false));
    }

    #[test]
    fn the_recent_window_reaches_back_to_a_results_call_and_never_ends_with_an_open_call() {
        use rein_runtime_contract::message::ToolCall;
        let call = ToolCall::new("c1", "ls", json!({}));
        let messages = vec![
            Message::user("task"),
            Message::assistant_with_tools("", vec![call.clone()]),
            Message::tool("c1", "a b"),
            Message::assistant("done"),
            Message::assistant_with_tools("", vec![call]),
        ];
        // The last 3 start with a result: its call comes along; the open
        // call at the end is left out.
        let window = recent(&messages, 3);
        assert_eq!(window.len(), 3);
        assert_eq!(window[0].tool_calls.len(), 1);
        assert_eq!(window[2].content, "done");
        let text = transcript(&messages[..4], Some(10));
        assert!(text.contains("[assistant called ls] {}"), "{text}");
        assert!(text.contains("[tool result] a b"), "{text}");
    }
}
