//! Invariant 6: a limit of 0 (or an empty name or pattern) disables a policy.

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
use rein::prelude::*;
use serde_json::json;

/// A model that calls `echo` until it has seen `rounds` tool results.
fn rounds(n: usize) -> ScriptedExecutor {
    ScriptedExecutor::from_fn(move |req| {
        let done = req.messages.iter().filter(|m| m.role == Role::Tool).count();
        if done < n {
            ScriptedResponse::tool_call("echo", json!({"i": done})).with_usage(1000, 1000)
        } else {
            ScriptedResponse::text("finished")
        }
    })
}

#[tokio::test]
async fn max_rounds_zero_is_unbounded() {
    let runtime = builder_with(rounds(40), spec().with_max_rounds(0))
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(r.termination, TerminationReason::NaturalEnd);
    assert_eq!(r.steps, 41);
}

#[tokio::test]
async fn the_default_max_rounds_is_sixteen() {
    assert_eq!(AgentSpec::new("a").max_rounds, 16);
    let runtime = builder_with(rounds(40), spec())
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(r.termination.stop_code(), Some("max_rounds"));
    assert_eq!(r.steps, 16);
}

#[tokio::test]
async fn zero_limits_and_empty_patterns_in_stop_conditions_never_stop() {
    let mut s = spec().with_max_rounds(0);
    for c in [
        StopConditionSpec::MaxRounds { rounds: 0 },
        StopConditionSpec::Timeout { seconds: 0 },
        StopConditionSpec::TokenBudget { max_total: 0 },
        StopConditionSpec::ConsecutiveErrors { max: 0 },
        StopConditionSpec::StopOnTool {
            tool_name: String::new(),
        },
        StopConditionSpec::ContentMatch {
            pattern: String::new(),
        },
        StopConditionSpec::LoopDetection { window: 0 },
    ] {
        s = s.with_stop_condition(c);
    }
    let runtime = builder_with(rounds(20), s)
        .with_tool("echo", Arc::new(Echo("echo")))
        .build()
        .unwrap();
    let r = runtime.run_to_completion(user("t", "go")).await.unwrap();
    assert_eq!(r.termination, TerminationReason::NaturalEnd);
    assert_eq!(r.steps, 21);
    assert_eq!(r.usage.total(), 40_000);
}
