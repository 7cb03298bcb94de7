//! `awaiting_user`: a final answer that asks the user something the agent
//! needs ends the run `stopped(awaiting_user)`; a ladder can nudge it on
//! instead; auto mode answers it with "proceed" nudges, up to a count. And
//! the classifier's precision and recall on the labelled sets in
//! `tests/data/awaiting_user.jsonl` and `tests/data/awaiting_user_heldout.jsonl`
//! (tune and held-out halves, by language).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use std::sync::Arc;

use common::*;
use rein::auto::AutomationPolicy;
use rein::contract::event::AgentEvent;
use rein::detectors::{PROCEED_NUDGE, looks_like_awaiting_user};
use rein::escalation::{EscalationAction, EscalationStep, Ladder};
use rein::prelude::*;

const ASKING: &str =
    "I prepared the migration for the orders table.\n\nShall I run it on production now?";

fn awaiting() -> StopConditionSpec {
    StopConditionSpec::AwaitingUser { auto_nudges: 1 }
}

#[tokio::test]
async fn an_answer_that_asks_permission_stops_the_run_as_awaiting_user() {
    let model = || ScriptedExecutor::new(vec![ScriptedResponse::text(ASKING)]);
    let runtime = builder_with(model(), spec().with_stop_condition(awaiting()))
        .build()
        .unwrap();
    let result = runtime
        .run_to_completion(user("t", "migrate"))
        .await
        .unwrap();
    match &result.termination {
        TerminationReason::Stopped(r) => {
            assert_eq!(r.code, "awaiting_user");
            assert!(
                r.detail.contains("shall i run it on production now?"),
                "{}",
                r.detail
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(result.response, ASKING, "the question is the answer");
    let report = &result.report;
    assert!(report.resumable);
    assert!(
        report
            .hint
            .as_deref()
            .is_some_and(|h| h.contains("answer it in a new message")),
        "{report:?}"
    );
    // Without the condition the same answer ends the run naturally.
    let runtime = builder_with(model(), spec()).build().unwrap();
    let result = runtime
        .run_to_completion(user("t", "migrate"))
        .await
        .unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
}

#[tokio::test]
async fn a_nudge_step_tells_the_model_to_proceed_and_the_run_goes_on() {
    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::text(ASKING),
        ScriptedResponse::text("I ran the migration on production; 1 204 rows were updated."),
    ]);
    let ladder = Ladder::new(vec![
        EscalationStep::new(EscalationAction::Nudge, 1),
        EscalationStep::new(EscalationAction::Stop, 1),
    ])
    .unwrap();
    let agent = spec()
        .with_stop_condition(awaiting())
        .with_escalation("awaiting_user", ladder);
    let runtime = builder_with(model, agent).build().unwrap();
    let sink = Arc::new(CollectingSink::new());
    let result = runtime
        .run(user("t", "migrate"), sink.clone())
        .await
        .unwrap();
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    assert!(
        sink.events()
            .iter()
            .any(|e| matches!(e, AgentEvent::Nudge { text, .. } if text == PROCEED_NUDGE))
    );
    let history = runtime.thread_messages("t").await;
    assert!(
        history
            .iter()
            .any(|m| m.role == Role::User && m.content == PROCEED_NUDGE)
    );
}

#[tokio::test]
async fn auto_mode_answers_with_proceed_nudges_up_to_the_count_then_stops() {
    let model = ScriptedExecutor::new(vec![ScriptedResponse::text(ASKING)]).repeat_last();
    let runtime = builder_with(model, spec().with_stop_condition(awaiting()))
        .build()
        .unwrap();
    let sink = Arc::new(CollectingSink::new());
    let r = runtime
        .auto_run(
            user("t", "migrate"),
            AutomationPolicy::from_json("null").unwrap(),
            sink.clone(),
        )
        .await
        .unwrap();
    assert!(
        r.stop_reason
            .starts_with("awaiting user: the answer ends by asking the user"),
        "{}",
        r.stop_reason
    );
    assert_eq!(
        r.rounds, 2,
        "one proceed nudge (auto_nudges: 1), then the stop"
    );
    let history = runtime.thread_messages("t").await;
    let nudged = history
        .iter()
        .filter(|m| m.role == Role::User && m.content.contains(PROCEED_NUDGE))
        .count();
    assert_eq!(nudged, 1);
}

#[test]
fn the_condition_loads_from_yaml_with_its_count() {
    let specs = rein::config::load_stop_conditions_yaml(
        "- { type: awaiting_user }\n- { type: awaiting_user, auto_nudges: 5 }\n",
    )
    .unwrap();
    assert_eq!(specs[0], StopConditionSpec::AwaitingUser { auto_nudges: 2 });
    assert_eq!(specs[1], StopConditionSpec::AwaitingUser { auto_nudges: 5 });
    let e =
        rein::config::load_stop_conditions_yaml("- { type: awaiting_user, auto_nudges: 500 }\n")
            .unwrap_err();
    assert!(e.to_string().contains("at most 100"), "{e}");
}

/// One labelled answer.
#[derive(serde::Deserialize)]
struct Labelled {
    id: String,
    awaiting: bool,
    text: String,
    /// `en` or `zh` (the second set only).
    #[serde(default)]
    lang: String,
    /// `tune` or `heldout` (the second set only).
    #[serde(default)]
    split: String,
}

fn load(data: &str) -> Vec<Labelled> {
    data.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The classifier's confusion counts on some answers, with the misses.
#[derive(Default)]
struct Score {
    tp: usize,
    fp: usize,
    fn_: usize,
    n: usize,
    misses: Vec<String>,
}

impl Score {
    fn of<'a>(items: impl IntoIterator<Item = &'a Labelled>) -> Self {
        let mut s = Self::default();
        for item in items {
            s.n += 1;
            match (looks_like_awaiting_user(&item.text), item.awaiting) {
                (true, true) => s.tp += 1,
                (true, false) => {
                    s.fp += 1;
                    s.misses.push(format!("false positive {}", item.id));
                }
                (false, true) => {
                    s.fn_ += 1;
                    s.misses.push(format!("false negative {}", item.id));
                }
                (false, false) => {}
            }
        }
        s
    }

    fn precision(&self) -> f64 {
        self.tp as f64 / (self.tp + self.fp).max(1) as f64
    }

    fn recall(&self) -> f64 {
        self.tp as f64 / (self.tp + self.fn_).max(1) as f64
    }

    fn line(&self, name: &str) -> String {
        format!(
            "{name}: {} answers, precision {:.3} ({}/{}), recall {:.3} ({}/{})",
            self.n,
            self.precision(),
            self.tp,
            self.tp + self.fp,
            self.recall(),
            self.tp,
            self.tp + self.fn_
        )
    }
}

#[test]
fn precision_and_recall_on_the_labelled_set() {
    let items = load(include_str!("data/awaiting_user.jsonl"));
    assert!(items.len() >= 200, "{} items", items.len());
    let score = Score::of(&items);
    let (precision, recall, misses) = (score.precision(), score.recall(), &score.misses);
    println!(
        "{}\n{}",
        score.line("awaiting_user on the first labelled set"),
        misses.join("\n")
    );
    assert!(
        precision >= PRECISION_FLOOR,
        "precision {precision:.3}; {misses:?}"
    );
    assert!(recall >= RECALL_FLOOR, "recall {recall:.3}; {misses:?}");
}

/// The floors the classifier must keep on the first set (measured values
/// are in docs/stop-policies.md).
const PRECISION_FLOOR: f64 = 0.95;
const RECALL_FLOOR: f64 = 0.95;

/// Floors on the second set (`awaiting_user_heldout.jsonl`), by split and
/// language: (split, language or "" for both, precision, recall). Set a
/// little below what the rules measured (docs/stop-policies.md); the
/// held-out half was not read while tuning them.
const SECOND_SET_FLOORS: &[(&str, &str, f64, f64)] = &[
    ("heldout", "", 0.90, 0.83),
    ("heldout", "en", 0.85, 0.82),
    ("heldout", "zh", 0.95, 0.85),
    ("tune", "", 0.98, 0.97),
    ("tune", "en", 0.98, 0.96),
    ("tune", "zh", 0.98, 0.97),
];

#[test]
fn precision_and_recall_on_the_second_set_tune_and_held_out_halves() {
    let items = load(include_str!("data/awaiting_user_heldout.jsonl"));
    assert!(items.len() >= 380, "{} items", items.len());
    let mut failures = Vec::new();
    for &(split, lang, precision_floor, recall_floor) in SECOND_SET_FLOORS {
        let score = Score::of(
            items
                .iter()
                .filter(|i| i.split == split && (lang.is_empty() || i.lang == lang)),
        );
        let name = format!("{split} {}", if lang.is_empty() { "all" } else { lang });
        println!("{}", score.line(&name));
        // The held-out half's misses are not printed: they are not for
        // tuning the rules.
        if split == "tune" && lang.is_empty() && !score.misses.is_empty() {
            println!("  {}", score.misses.join("\n  "));
        }
        if score.precision() < precision_floor || score.recall() < recall_floor {
            failures.push(score.line(&name));
        }
    }
    assert!(failures.is_empty(), "below the floors: {failures:?}");
}
