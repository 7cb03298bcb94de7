//! Content chanting through full runs: Markdown and text-drawing structure
//! that repeats by design is not chanting, and a chant is caught wherever it
//! happens — also inside one long list item or table row. Each answer is
//! streamed word by word under the default settings (chunk_chars 50,
//! threshold 10, stop).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use common::*;
use rein::contract::lifecycle::OnDetect;
use rein::prelude::*;

/// Runs one answer streamed by a scripted model under the default chanting
/// settings.
async fn run_answer(answer: String) -> AgentRunResult {
    let model = ScriptedExecutor::new(vec![ScriptedResponse::text(answer)]);
    builder_with(
        model,
        spec().with_stop_condition(StopConditionSpec::ContentChanting {
            chunk_chars: 50,
            threshold: 10,
            on_detect: OnDetect::Stop,
        }),
    )
    .build()
    .unwrap()
    .run_to_completion(user("t", "go"))
    .await
    .unwrap()
}

async fn assert_not_chanting(answer: String) {
    let r = run_answer(answer).await;
    assert_eq!(r.termination, TerminationReason::NaturalEnd, "{r:?}");
}

async fn assert_chanting(answer: String) {
    let r = run_answer(answer.clone()).await;
    assert_eq!(r.termination.stop_code(), Some("content_chanting"));
    assert!(
        r.response.len() < answer.len() / 2,
        "cut after {} of {} bytes",
        r.response.len(),
        answer.len()
    );
}

/// A 60-character sentence.
const SENTENCE: &str = "Retrying the request now as the last attempt has timed out. ";

#[tokio::test]
async fn a_report_of_twelve_sections_with_the_same_verdict_is_not_chanting() {
    let mut report = String::from("# Review of the billing service\n\n");
    for i in 1..=12 {
        report.push_str(&format!(
            "## File src/handlers/module_{i:02}.rs\n\n\
             Verdict: no issues found in this file, all checks passed.\n\n"
        ));
    }
    assert_not_chanting(report).await;
}

#[tokio::test]
async fn a_review_quoting_each_finding_before_the_same_reply_is_not_chanting() {
    let mut review = String::new();
    for i in 1..=12 {
        review.push_str(&format!(
            "> Finding {i}: `parse_{i}` returns early on empty input.\n\
             That is the intended behaviour, so no change is needed here.\n\n"
        ));
    }
    assert_not_chanting(review).await;
}

#[tokio::test]
async fn a_status_box_drawn_with_box_drawing_characters_is_not_chanting() {
    let rule = "─".repeat(78);
    let mut answer = format!("Test summary:\n╭{rule}╮\n");
    for _ in 0..12 {
        answer.push_str(&format!("│ {:<76} │\n", "✓ passed, no warnings, no errors"));
    }
    answer.push_str(&format!("├{rule}┤\n│ {:<76} │\n╰{rule}╯\n", "12 of 12"));
    assert_not_chanting(answer).await;
}

#[tokio::test]
async fn a_wide_ascii_table_with_plus_and_dash_borders_is_not_chanting() {
    let border = format!("{}+\n", "+---".repeat(30));
    let row = format!("{}|\n", "| x ".repeat(30));
    let answer = format!("Grid:\n{border}{row}{border}{row}{border}Done.\n");
    assert_not_chanting(answer).await;
}

#[tokio::test]
async fn a_listing_of_files_sharing_a_long_path_prefix_is_not_chanting() {
    // A 70-character prefix shared by every line.
    let prefix = "/home/developers/projects/acme-platform/services/billing/src/handlers/";
    assert_eq!(prefix.chars().count(), 70);
    let names = [
        "invoice.rs",
        "refund.rs",
        "payment_intent.rs",
        "customer.rs",
        "subscription.rs",
        "webhook.rs",
        "tax.rs",
        "currency.rs",
        "ledger.rs",
        "dispute.rs",
        "payout.rs",
        "coupon.rs",
        "receipt.rs",
        "audit_log.rs",
        "mod.rs",
    ];
    let mut listing = String::from("The handlers are:\n");
    for name in names {
        listing.push_str(&format!("{prefix}{name}\n"));
    }
    assert_not_chanting(listing).await;
}

#[tokio::test]
async fn a_sentence_chanted_inside_one_long_bullet_is_chanting() {
    assert_chanting(format!("- {}", SENTENCE.repeat(40))).await;
}

#[tokio::test]
async fn a_sentence_chanted_inside_one_table_row_is_chanting() {
    assert_chanting(format!("| id | note |\n| 1 | {} |\n", SENTENCE.repeat(40))).await;
}

#[tokio::test]
async fn a_sentence_chanted_after_a_heading_is_chanting() {
    assert_chanting(format!("## Status\n\n{}", SENTENCE.repeat(40))).await;
}
