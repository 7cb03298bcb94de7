//! [`TerminalPrinter`]: a run's events for a person at a terminal.
//!
//! The model's text goes to standard output as it streams; everything
//! about the run — tool calls and results, retries, nudges, auto-mode
//! progress, and why the run ended — goes to standard error, one line
//! each, so `program > answer.txt` keeps only the answer. A sub-agent's
//! lines (its text included, line by line) are indented under the call
//! that started it, two spaces per level.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Mutex;

use futures::StreamExt;
use rein_runtime_contract::event::{AgentEvent, CancelCause, EventSink};
use rein_runtime_contract::lifecycle::TerminationReason;

use crate::run::AgentRunResult;
use crate::runtime::RuntimeError;
use crate::stream::RunStream;

/// How much of a tool's arguments or result a line shows.
const SHOWN_CHARS: usize = 160;

/// Prints a run's events: streamed text to stdout, the rest to stderr.
///
/// Use it as a sink (`RunRequest::with_event_sink(Arc::new(TerminalPrinter::new()))`)
/// or on a stream:
///
/// ```no_run
/// # async fn demo(runtime: rein_runtime::AgentRuntime, request: rein_runtime::RunRequest)
/// # -> Result<(), rein_runtime::RuntimeError> {
/// use rein_runtime::TerminalPrinter;
/// let result = TerminalPrinter::new().print_stream(runtime.run_stream(request)).await?;
/// # Ok(()) }
/// ```
///
/// Lines it writes to stderr:
///
/// ```text
/// [tool] weather {"city":"Paris"}
/// [tool] weather -> {"celsius":14,"city":"Paris","sky":"light rain"}
/// [tool] weather failed: error: no weather station for "Oslo"
/// [retry] attempt 2 in 500 ms: rate limited (429)
/// [nudge] You are repeating yourself; …
/// [auto] round 2 done (1200 tokens)
/// [end] natural_end · 2 rounds · 113 tokens in / 27 out
/// [end] stopped (max_rounds): … · 16 rounds · …
/// [end] cancelled (interrupted by run-7) · 3 rounds   (no usage reported)
/// [subagent] researcher started (run-8)
///   │ There are two trains.
///   [end] natural_end · 1 round · 7 tokens in / 3 out
/// [subagent] researcher ended: natural_end
/// ```
pub struct TerminalPrinter {
    out: Mutex<Output>,
}

struct Output {
    stdout: Box<dyn Write + Send>,
    stderr: Box<dyn Write + Send>,
    /// Whether the last thing written to stdout left a line open.
    open_line: bool,
    /// Sub-agent runs: their depth (1 for a child of the root), agent and
    /// the part of their text not printed yet (it is printed by line).
    children: HashMap<String, Child>,
}

struct Child {
    depth: usize,
    agent: String,
    text: String,
}

impl std::fmt::Debug for TerminalPrinter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TerminalPrinter").finish_non_exhaustive()
    }
}

impl Default for TerminalPrinter {
    fn default() -> Self {
        Self::new()
    }
}

impl TerminalPrinter {
    /// A printer to the process's stdout and stderr.
    pub fn new() -> Self {
        Self::with_writers(std::io::stdout(), std::io::stderr())
    }

    /// A printer to other writers (a file, a buffer in a test): `text` gets
    /// the model's text, `status` the rest.
    pub fn with_writers(
        text: impl Write + Send + 'static,
        status: impl Write + Send + 'static,
    ) -> Self {
        Self {
            out: Mutex::new(Output {
                stdout: Box::new(text),
                stderr: Box::new(status),
                open_line: false,
                children: HashMap::new(),
            }),
        }
    }

    /// Prints one event. Write errors (a closed pipe) are ignored: printing
    /// never fails a run.
    pub fn print(&self, event: &AgentEvent) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let _ = out.print(event);
    }

    /// Prints every event of `stream` and returns the run's result.
    ///
    /// # Errors
    ///
    /// The run's [`RuntimeError`] when it could not start.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the stream, which cancels the run.
    pub async fn print_stream(
        &self,
        mut stream: RunStream,
    ) -> Result<AgentRunResult, RuntimeError> {
        while let Some(event) = stream.next().await {
            self.print(&event);
        }
        stream.wait().await
    }
}

impl EventSink for TerminalPrinter {
    fn emit(&self, event: AgentEvent) {
        self.print(&event);
    }
}

impl Output {
    fn print(&mut self, event: &AgentEvent) -> std::io::Result<()> {
        if let Some(depth) = self.children.get(event.run_id()).map(|c| c.depth) {
            let indent = "  ".repeat(depth);
            let mut lines = Vec::new();
            if let Some(child) = self.children.get_mut(event.run_id()) {
                if let AgentEvent::TextDelta { delta, .. } = event {
                    child.text.push_str(delta);
                    while let Some(end) = child.text.find('\n') {
                        let line: String = child.text.drain(..=end).collect();
                        lines.push(format!("{indent}│ {}", line.trim_end()));
                    }
                } else if !child.text.is_empty() {
                    // A round's text ends where the run's next line starts.
                    let text = std::mem::take(&mut child.text);
                    lines.push(format!("{indent}│ {}", text.trim_end()));
                }
            }
            if !matches!(event, AgentEvent::TextDelta { .. }) {
                lines.extend(self.line_for(event).map(|l| format!("{indent}{l}")));
            }
            for line in lines {
                self.status(&line)?;
            }
            return Ok(());
        }
        if let AgentEvent::TextDelta { delta, .. } = event {
            self.stdout.write_all(delta.as_bytes())?;
            self.open_line = !delta.ends_with('\n');
            return self.stdout.flush();
        }
        match self.line_for(event) {
            Some(line) => self.status(&line),
            None => Ok(()),
        }
    }

    /// The stderr line for an event, noting sub-agent runs as they start
    /// and end.
    fn line_for(&mut self, event: &AgentEvent) -> Option<String> {
        match event {
            AgentEvent::SubagentStarted {
                run_id,
                child_run_id,
                agent_id,
                ..
            } => {
                let depth = self.children.get(run_id).map_or(0, |c| c.depth) + 1;
                self.children.insert(
                    child_run_id.clone(),
                    Child {
                        depth,
                        agent: agent_id.clone(),
                        text: String::new(),
                    },
                );
                Some(format!("[subagent] {agent_id} started ({child_run_id})"))
            }
            AgentEvent::SubagentFinished {
                child_run_id,
                termination,
                ..
            } => {
                let agent = self
                    .children
                    .remove(child_run_id)
                    .map_or_else(|| child_run_id.clone(), |c| c.agent);
                Some(format!("[subagent] {agent} ended: {}", termination.code()))
            }
            other => status_line(other),
        }
    }

    /// Writes one line to stderr, ending stdout's open line first.
    fn status(&mut self, line: &str) -> std::io::Result<()> {
        if self.open_line {
            // End the streamed text's line before a status line interrupts it.
            self.stdout.write_all(b"\n")?;
            self.stdout.flush()?;
            self.open_line = false;
        }
        writeln!(self.stderr, "{line}")?;
        self.stderr.flush()
    }
}

/// The stderr line for an event; `None` for events not worth a line.
fn status_line(event: &AgentEvent) -> Option<String> {
    Some(match event {
        AgentEvent::ToolCallStarted {
            name, arguments, ..
        } => format!("[tool] {name} {}", shorten(&arguments.to_string())),
        AgentEvent::ToolCallFinished {
            name,
            result,
            is_error: false,
            ..
        } => format!("[tool] {name} -> {}", shorten(result)),
        AgentEvent::ToolCallFinished {
            name,
            result,
            is_error: true,
            ..
        } => format!("[tool] {name} failed: {}", shorten(result)),
        AgentEvent::InferenceRetry {
            attempt,
            error,
            delay_ms,
            ..
        } => format!(
            "[retry] attempt {} in {delay_ms} ms: {}",
            attempt.saturating_add(1),
            shorten(error)
        ),
        AgentEvent::Nudge { text, .. } => format!("[nudge] {}", shorten(text)),
        AgentEvent::ModelFallback {
            from_model,
            to_model,
            error,
            ..
        } => format!("[fallback] {from_model} → {to_model}: {}", shorten(error)),
        AgentEvent::RateLimited {
            provider, wait_ms, ..
        } => format!("[rate limited] waiting about {wait_ms} ms for provider \"{provider}\""),
        AgentEvent::ApprovalRequested {
            tool, arguments, ..
        } => format!(
            "[approval] waiting: {tool} {}",
            shorten(&arguments.to_string())
        ),
        AgentEvent::ApprovalDecided {
            call_id, decision, ..
        } => format!("[approval] {call_id}: {decision}"),
        AgentEvent::Progress {
            message,
            tokens_used_session,
            ..
        } => format!("[auto] {message} ({tokens_used_session} tokens)"),
        AgentEvent::RunFinished {
            termination,
            cancel_cause,
            steps,
            usage,
            ..
        } => {
            let reason = match (termination, cancel_cause) {
                (TerminationReason::Cancelled, Some(CancelCause::Interrupted { by_run_id })) => {
                    format!("cancelled (interrupted by {by_run_id})")
                }
                (TerminationReason::Cancelled, Some(CancelCause::Shutdown)) => {
                    "cancelled (shutdown)".to_owned()
                }
                // The code, as in the run record (`natural_end`).
                (TerminationReason::NaturalEnd, _) => "natural_end".to_owned(),
                (other, _) => other.to_string(),
            };
            let rounds = format!("{steps} round{}", if *steps == 1 { "" } else { "s" });
            if usage.input_tokens == 0 && usage.output_tokens == 0 {
                format!("[end] {reason} · {rounds}")
            } else {
                format!(
                    "[end] {reason} · {rounds} · {} tokens in / {} out",
                    usage.input_tokens, usage.output_tokens
                )
            }
        }
        _ => return None,
    })
}

/// The first line of `text`, at most [`SHOWN_CHARS`] characters, marked
/// with `…` when cut.
fn shorten(text: &str) -> String {
    let first = text.lines().next().unwrap_or("");
    let mut shown: String = first.chars().take(SHOWN_CHARS).collect();
    if shown.len() < text.len() {
        shown.push('…');
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer whose bytes a test reads back.
    #[derive(Clone, Default)]
    struct Buffer(std::sync::Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_sub_agent_s_lines_and_text_are_indented_under_its_call_and_off_stdout() {
        use rein_runtime_contract::message::TokenUsage;
        let (out, err) = (Buffer::default(), Buffer::default());
        let printer = TerminalPrinter::with_writers(out.clone(), err.clone());
        let ids = |run: &str| (run.to_owned(), "t".to_owned());
        let started = |run: &str, child: &str, agent: &str| AgentEvent::SubagentStarted {
            run_id: run.to_owned(),
            thread_id: "t".to_owned(),
            call_id: "c".to_owned(),
            child_run_id: child.to_owned(),
            child_thread_id: "t:c".to_owned(),
            agent_id: agent.to_owned(),
        };
        let text = |run: &str, delta: &str| {
            let (run_id, thread_id) = ids(run);
            AgentEvent::TextDelta {
                run_id,
                thread_id,
                delta: delta.to_owned(),
            }
        };
        let end = |run: &str| {
            let (run_id, thread_id) = ids(run);
            AgentEvent::RunFinished {
                run_id,
                thread_id,
                termination: TerminationReason::NaturalEnd,
                response: String::new(),
                cancel_cause: None,
                steps: 1,
                usage: TokenUsage::default(),
                cache_usage: None,
                outputs: Default::default(),
                report: None,
            }
        };
        let finished = |run: &str, child: &str| AgentEvent::SubagentFinished {
            run_id: run.to_owned(),
            thread_id: "t".to_owned(),
            call_id: "c".to_owned(),
            child_run_id: child.to_owned(),
            termination: TerminationReason::NaturalEnd,
        };
        for event in [
            started("root", "kid", "researcher"),
            text("kid", "two "),
            text("kid", "trains\nand "),
            started("kid", "grandkid", "clerk"),
            text("grandkid", "a bus"),
            end("grandkid"),
            finished("kid", "grandkid"),
            text("kid", "a bus"),
            end("kid"),
            finished("root", "kid"),
            text("root", "Done."),
        ] {
            printer.print(&event);
        }
        let err = String::from_utf8(err.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            err,
            "[subagent] researcher started (kid)\n  │ two trains\n  │ and\n  [subagent] clerk started (grandkid)\n    │ a bus\n    [end] natural_end · 1 round\n  [subagent] clerk ended: natural_end\n  │ a bus\n  [end] natural_end · 1 round\n[subagent] researcher ended: natural_end\n"
        );
        assert_eq!(
            String::from_utf8(out.0.lock().unwrap().clone()).unwrap(),
            "Done."
        );
    }

    #[test]
    fn a_rate_limited_wait_is_shown_with_its_provider_and_expected_wait() {
        let event = AgentEvent::RateLimited {
            run_id: "run-1".into(),
            thread_id: "t".into(),
            provider: "hosted".into(),
            wait_ms: 250,
        };
        assert_eq!(
            status_line(&event).as_deref(),
            Some("[rate limited] waiting about 250 ms for provider \"hosted\"")
        );
    }

    #[test]
    fn shorten_keeps_short_single_lines_and_marks_cuts() {
        assert_eq!(shorten("ok"), "ok");
        assert_eq!(shorten("a\nb"), "a…");
        assert_eq!(shorten(&"x".repeat(200)).chars().count(), SHOWN_CHARS + 1);
    }
}
