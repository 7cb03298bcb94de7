//! `rein run`'s approvals at the terminal: each call the run waits on is
//! shown, and a line of stdin decides it — `approve` (or `a`), `reject
//! [reason]` (`r`), `edit <json arguments>` (`e`); for a question, the line
//! is the answer (or one of the options by its number). Stdin need not be
//! a terminal (a script may pipe decisions); when it closes, every call
//! still waiting is rejected.

use std::collections::VecDeque;
use std::io::IsTerminal;

use rein::contract::approval::{Decision, PendingApproval, PendingKind};
use tokio::sync::mpsc;

use crate::service::Service;

/// Who the decisions taken at the terminal are recorded as.
const DECIDER: &str = "rein run";

/// The calls waiting for the person at the terminal, and the lines they type.
#[derive(Debug)]
pub(crate) struct Prompter {
    waiting: VecDeque<PendingApproval>,
    lines: mpsc::UnboundedReceiver<String>,
    /// Whether the head of `waiting` was shown.
    shown: bool,
    closed: bool,
    terminal: bool,
}

impl Prompter {
    /// Starts reading stdin (on a blocking thread) lazily: the first line
    /// is read only once something waits.
    pub(crate) fn new() -> Self {
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            let stdin = std::io::stdin();
            let mut line = String::new();
            loop {
                line.clear();
                match stdin.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if tx.send(line.trim_end().to_owned()).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        Self {
            waiting: VecDeque::new(),
            lines,
            shown: false,
            closed: false,
            terminal: std::io::stdin().is_terminal(),
        }
    }

    /// Notes a call the run (or one of its sub-agents) now waits on.
    pub(crate) fn requested(&mut self, pending: PendingApproval) {
        self.waiting.push_back(pending);
        self.show();
    }

    /// Forgets a call decided some other way (its timeout).
    pub(crate) fn decided(&mut self, call_id: &str) {
        let head = self.waiting.front().map(|p| p.call_id.clone());
        self.waiting.retain(|p| p.call_id != call_id);
        if head.as_deref() == Some(call_id) {
            self.shown = false;
            self.show();
        }
    }

    fn show(&mut self) {
        let Some(p) = self.waiting.front() else {
            return;
        };
        if self.shown {
            return;
        }
        self.shown = true;
        match p.kind {
            PendingKind::Escalation => {
                eprintln!(
                    "escalation: {}: {}",
                    p.tool,
                    p.arguments["detail"].as_str().unwrap_or_default()
                );
                eprint!("continue [message] / stop / take over> ");
            }
            PendingKind::Question => {
                eprintln!("? {}", p.question.as_deref().unwrap_or_default());
                for (i, option) in p.options.iter().enumerate() {
                    eprintln!("  {}. {option}", i + 1);
                }
                eprint!("answer> ");
            }
            _ => {
                eprintln!(
                    "approval needed: {} {}{}",
                    p.tool,
                    p.arguments,
                    p.expires_at
                        .as_deref()
                        .map(|t| format!(" (until {t})"))
                        .unwrap_or_default()
                );
                eprint!("approve / reject [reason] / edit <json>> ");
            }
        }
        if !self.terminal {
            eprintln!();
        }
    }

    /// Waits for the next line while something waits (never resolves
    /// otherwise); `None` once stdin closed.
    pub(crate) async fn next_line(&mut self) -> Option<String> {
        if self.waiting.is_empty() || self.closed {
            return std::future::pending().await;
        }
        let line = self.lines.recv().await;
        if line.is_none() {
            self.closed = true;
        }
        line
    }

    /// Decides the head call with `line` (`None`: stdin closed, so every
    /// waiting call is rejected).
    pub(crate) async fn answer(&mut self, service: &Service, line: Option<String>) {
        let Some(line) = line else {
            while let Some(p) = self.waiting.pop_front() {
                let reject = Decision::Reject {
                    reason: Some("no decision: stdin closed".to_owned()),
                };
                if let Err(e) = service
                    .decide_as(&p.run_id, &p.call_id, reject, Some(DECIDER))
                    .await
                {
                    eprintln!("rein: {e}");
                }
            }
            return;
        };
        let Some(p) = self.waiting.front().cloned() else {
            return;
        };
        let decision = match parse(&p, &line) {
            Ok(d) => d,
            Err(message) => {
                eprintln!("rein: {message}");
                self.shown = false;
                self.show();
                return;
            }
        };
        match service
            .decide_as(&p.run_id, &p.call_id, decision, Some(DECIDER))
            .await
        {
            Ok(_) => {
                self.waiting.pop_front();
                self.shown = false;
                self.show();
            }
            Err(e) => {
                eprintln!("rein: {e}");
                self.shown = false;
                self.show();
            }
        }
    }
}

/// The decision a typed line means for `pending`.
fn parse(pending: &PendingApproval, line: &str) -> Result<Decision, String> {
    let line = line.trim();
    let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
    let rest = rest.trim();
    let reason = (!rest.is_empty()).then(|| rest.to_owned());
    if pending.kind == PendingKind::Escalation {
        return match word {
            "continue" | "c" => Ok(Decision::Continue { message: reason }),
            "stop" | "s" => Ok(Decision::Stop),
            "take" | "take_over" | "t" => Ok(Decision::TakeOver),
            _ => Err(format!(
                "\"{line}\" is not an answer: type continue [message], stop or take over"
            )),
        };
    }
    if pending.kind == PendingKind::Question {
        if matches!(word, "reject" | "r") && rest.is_empty() {
            return Ok(Decision::Reject { reason: None });
        }
        let answer = line
            .parse::<usize>()
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| pending.options.get(i))
            .map_or_else(|| line.to_owned(), Clone::clone);
        return Ok(Decision::Respond {
            result: serde_json::Value::String(answer),
        });
    }
    match word {
        "approve" | "a" | "y" | "yes" => Ok(Decision::Approve),
        "reject" | "r" | "n" | "no" => Ok(Decision::Reject { reason }),
        "edit" | "e" => serde_json::from_str(rest)
            .map(|arguments| Decision::Edit { arguments })
            .map_err(|e| format!("edit needs the new arguments as JSON after it: {e}")),
        _ => Err(format!(
            "\"{line}\" is not a decision: type approve, reject [reason] or edit <json arguments>"
        )),
    }
}
