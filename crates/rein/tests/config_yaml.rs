//! Stop conditions and agent specs load from YAML strings and files; every
//! error says what is wrong and where; every spec survives a round trip.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

use std::path::PathBuf;

use proptest::prelude::*;
use rein::config::{
    ConfigError, load_agent_spec_file, load_agent_spec_yaml, load_stop_conditions_file,
    load_stop_conditions_yaml,
};
use rein::contract::inference::ToolChoice;
use rein::prelude::*;

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents")
}

fn pos(e: &ConfigError) -> (Option<usize>, Option<usize>) {
    (e.line(), e.column())
}

#[test]
fn the_checked_in_agent_example_loads() {
    let spec = load_agent_spec_file(examples().join("triage.yaml")).unwrap();
    assert_eq!(spec.id, "triage");
    assert_eq!(spec.model_id, "scripted");
    assert_eq!(spec.max_rounds, 8);
    assert_eq!(spec.tool_choice, ToolChoice::Auto);
    assert_eq!(spec.stop_conditions.len(), 6);
    assert_eq!(
        spec.stop_conditions[0],
        StopConditionSpec::Timeout { seconds: 120 }
    );
    let list = load_stop_conditions_file(examples().join("stop-conditions.yaml")).unwrap();
    assert_eq!(
        list,
        [
            StopConditionSpec::MaxRounds { rounds: 10 },
            StopConditionSpec::Timeout { seconds: 300 },
            StopConditionSpec::TokenBudget { max_total: 100_000 },
            StopConditionSpec::ConsecutiveErrors { max: 3 },
        ]
    );
}

#[test]
fn a_misspelt_key_on_line_four_of_a_file_is_reported_at_line_four() {
    let dir = std::env::temp_dir().join(format!("rein-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.yaml");
    std::fs::write(
        &path,
        "- type: max_rounds\n  rounds: 10\n- type: token_budget\n  max_totl: 5\n",
    )
    .unwrap();
    let e = load_stop_conditions_file(&path).unwrap_err();
    assert_eq!(pos(&e), (Some(4), Some(3)));
    assert_eq!(e.path(), Some(path.as_path()));
    assert_eq!(
        e.to_string(),
        format!(
            "{}: line 4, column 3: stop condition #2 (token_budget): unknown field `max_totl`, expected `type` or `max_total`",
            path.display()
        )
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_file_names_the_file() {
    let e = load_agent_spec_file("/nonexistent/agent.yaml").unwrap_err();
    assert!(
        e.to_string()
            .starts_with("/nonexistent/agent.yaml: cannot read the file:"),
        "{e}"
    );
    assert_eq!(pos(&e), (None, None));
}

#[test]
fn each_error_kind_points_where_the_contract_says() {
    let cases: &[(&str, (usize, usize), &str)] = &[
        // unknown type: at the item's `type` value
        (
            "- type: max_roundz\n  rounds: 3\n",
            (1, 9),
            "unknown stop condition type \"max_roundz\"",
        ),
        // missing field: at the item
        (
            "- type: stop_on_tool\n",
            (1, 3),
            "missing field `tool_name`",
        ),
        // wrong type: at the value
        (
            "- type: consecutive_errors\n  max: three\n",
            (2, 8),
            "invalid type: string \"three\"",
        ),
        // out of range: at the value
        (
            "- type: timeout\n  seconds: 86401\n",
            (2, 12),
            "86401 is out of range",
        ),
        (
            "- type: loop_detection\n  window: 65\n",
            (2, 11),
            "window must be 0 (disabled) or 2 to 64",
        ),
        (
            "- type: token_budget\n  max_total: 2000000000\n",
            (2, 14),
            "max_total must be at most 1000000000",
        ),
        // invalid regex: at the value, naming the pattern and the error
        (
            "- type: content_match\n  pattern: 'a{2,1}'\n",
            (2, 12),
            "invalid regex \"a{2,1}\"",
        ),
        // a top-level mapping with another key: at the key
        (
            "stop_condition:\n  - {type: max_rounds, rounds: 1}\n",
            (1, 1),
            "unknown field `stop_condition`",
        ),
    ];
    for (yaml, (line, column), needle) in cases {
        let e = load_stop_conditions_yaml(yaml).unwrap_err();
        assert_eq!(pos(&e), (Some(*line), Some(*column)), "{yaml:?}: {e}");
        assert!(e.message().contains(needle), "{yaml:?}: {e}");
    }
    let long = format!("- type: content_match\n  pattern: '{}'\n", "a".repeat(1025));
    let e = load_stop_conditions_yaml(&long).unwrap_err();
    assert!(
        e.message()
            .starts_with("stop condition #1 (content_match), field `pattern`: "),
        "{e}"
    );
    assert!(
        e.message().contains("1025 characters long; at most 1024"),
        "{e}"
    );
}

#[test]
fn agent_spec_errors_point_at_keys_and_values() {
    let e = load_agent_spec_yaml("id: a\nmodel_id: m\nsystem_promt: hi\n").unwrap_err();
    assert_eq!(pos(&e), (Some(3), Some(1)));
    assert!(e.message().contains("unknown field `system_promt`"), "{e}");
    let e = load_agent_spec_yaml("id: a\nmax_rounds: -1\n").unwrap_err();
    assert_eq!(pos(&e), (Some(2), Some(13)));
    assert!(e.message().starts_with("field `max_rounds`: "), "{e}");
    let e = load_agent_spec_yaml("id: a\ntool_choice: sometimes\n").unwrap_err();
    assert!(
        e.message().contains("unknown tool_choice \"sometimes\""),
        "{e}"
    );
    let spec = load_agent_spec_yaml(
        "id: a\ntool_choice: { tool: search }\nplugin_ids: [stop-condition]\n",
    )
    .unwrap();
    assert_eq!(spec.tool_choice, ToolChoice::Tool("search".into()));
    assert_eq!(spec.plugin_ids, ["stop-condition"]);
}

#[test]
fn zero_values_load_and_mean_disabled() {
    let specs = load_stop_conditions_yaml(
        "- {type: timeout, seconds: 0}\n- {type: token_budget, max_total: 0}\n- {type: loop_detection, window: 0}\n- {type: content_match, pattern: ''}\n",
    )
    .unwrap();
    assert_eq!(specs.len(), 4);
}

#[test]
fn loop_detectors_load_with_defaults_and_bounds() {
    use rein::contract::lifecycle::OnDetect;
    let specs = load_stop_conditions_yaml(
        "- type: tool_call_loop\n- type: content_chanting\n  on_detect: nudge_then_stop\n- type: stuck\n- {type: tool_call_loop, threshold: 3, max_cycle: 2}\n",
    )
    .unwrap();
    assert_eq!(
        specs,
        [
            StopConditionSpec::ToolCallLoop {
                threshold: 5,
                max_cycle: 5,
                on_detect: OnDetect::Stop
            },
            StopConditionSpec::ContentChanting {
                chunk_chars: 50,
                threshold: 10,
                on_detect: OnDetect::NudgeThenStop
            },
            StopConditionSpec::Stuck { duplicates: 2 },
            StopConditionSpec::ToolCallLoop {
                threshold: 3,
                max_cycle: 2,
                on_detect: OnDetect::Stop
            },
        ]
    );
    let cases: &[(&str, &str)] = &[
        (
            "- {type: tool_call_loop, threshold: 1}",
            "threshold must be 0 (disabled) or 2 to 1000",
        ),
        (
            "- {type: tool_call_loop, threshold: 18446744073709551615}",
            "18446744073709551615 is out of range: threshold must be 0 (disabled) or 2 to 1000",
        ),
        (
            "- {type: content_chanting, threshold: 1001}",
            "1001 is out of range: threshold must be 0 (disabled) or 2 to 1000",
        ),
        (
            "- {type: max_rounds, rounds: 1000001}",
            "rounds must be at most 1000000",
        ),
        (
            "- {type: consecutive_errors, max: 99999999999}",
            "max must be at most 1000000",
        ),
        (
            "- {type: stuck, duplicates: 64}",
            "duplicates must be at most 63",
        ),
        (
            "- {type: tool_call_loop, max_cycle: 17}",
            "max_cycle must be 0 (disabled) or 1 to 16",
        ),
        (
            "- {type: content_chanting, chunk_chars: 7}",
            "chunk_chars must be 0 (disabled) or 8 to 1000",
        ),
        (
            "- {type: content_chanting, chunk_chars: 1001}",
            "chunk_chars must be 0 (disabled) or 8 to 1000",
        ),
        (
            "- {type: content_chanting, on_detect: nudge}",
            "unknown variant `nudge`",
        ),
        ("- {type: stuck, duplicate: 2}", "unknown field `duplicate`"),
    ];
    for (yaml, needle) in cases {
        let e = load_stop_conditions_yaml(yaml).unwrap_err();
        assert!(e.message().contains(needle), "{yaml}: {e}");
        assert_eq!(e.line(), Some(1), "{yaml}: {e}");
    }
    // The agent's own max_rounds is bounded the same way, at the value.
    let e = load_agent_spec_yaml("id: a\nmax_rounds: 5000000\n").unwrap_err();
    assert!(
        e.message().contains("rounds must be at most 1000000"),
        "{e}"
    );
    assert_eq!((e.line(), e.column()), (Some(2), Some(13)), "{e}");
    let zeros = load_stop_conditions_yaml(
        "- {type: tool_call_loop, threshold: 0, max_cycle: 0}\n- {type: content_chanting, chunk_chars: 0, threshold: 0}\n- {type: stuck, duplicates: 0}\n",
    );
    assert_eq!(zeros.unwrap().len(), 3);
}

#[test]
fn tool_error_loop_and_tool_call_cycle_load_with_defaults() {
    use rein::contract::lifecycle::OnDetect;
    let specs = load_stop_conditions_yaml(
        "- type: tool_error_loop\n\
         - {type: tool_error_loop, threshold: 5, on_detect: nudge_then_stop}\n\
         - {type: tool_call_cycle, cycle: 1, threshold: 4}\n\
         - {type: tool_call_cycle, cycle: 2}\n\
         - {type: tool_error_loop, threshold: 0}\n\
         - {type: tool_call_cycle, cycle: 0, threshold: 0}\n",
    )
    .unwrap();
    assert_eq!(
        specs,
        [
            StopConditionSpec::ToolErrorLoop {
                threshold: 3,
                on_detect: OnDetect::Stop
            },
            StopConditionSpec::ToolErrorLoop {
                threshold: 5,
                on_detect: OnDetect::NudgeThenStop
            },
            StopConditionSpec::ToolCallCycle {
                cycle: 1,
                threshold: 4,
                on_detect: OnDetect::Stop
            },
            StopConditionSpec::ToolCallCycle {
                cycle: 2,
                threshold: 5,
                on_detect: OnDetect::Stop
            },
            StopConditionSpec::ToolErrorLoop {
                threshold: 0,
                on_detect: OnDetect::Stop
            },
            StopConditionSpec::ToolCallCycle {
                cycle: 0,
                threshold: 0,
                on_detect: OnDetect::Stop
            },
        ]
    );
    let agent = load_agent_spec_yaml(
        "id: a\nstop_conditions:\n  - {type: tool_call_cycle, cycle: 2, threshold: 3}\n  - {type: tool_error_loop}\n",
    )
    .unwrap();
    assert_eq!(agent.stop_conditions.len(), 2);
}

#[test]
fn tool_error_loop_and_tool_call_cycle_errors_say_what_and_where() {
    let cases: &[(&str, (usize, usize), &str)] = &[
        (
            "- type: tool_error_loop\n  threshold: 1\n",
            (2, 14),
            "stop condition #1 (tool_error_loop), field `threshold`: 1 is out of range: threshold must be 0 (disabled) or 2 to 1000",
        ),
        (
            "- {type: max_rounds, rounds: 3}\n- type: tool_call_cycle\n  cycle: 17\n",
            (3, 10),
            "stop condition #2 (tool_call_cycle), field `cycle`: 17 is out of range: cycle must be 0 (disabled) or 1 to 16",
        ),
        (
            "- type: tool_call_cycle\n  cycle: 2\n  threshold: 1001\n",
            (3, 14),
            "stop condition #1 (tool_call_cycle), field `threshold`: 1001 is out of range: threshold must be 0 (disabled) or 2 to 1000",
        ),
        (
            "- type: tool_call_cycle\n  threshold: 3\n",
            (1, 3),
            "stop condition #1 (tool_call_cycle): missing field `cycle`",
        ),
        (
            "- type: tool_error_loop\n  max_cycle: 2\n",
            (2, 3),
            "stop condition #1 (tool_error_loop): unknown field `max_cycle`, expected one of `type`, `threshold`, `on_detect`",
        ),
        (
            "- type: tool_call_cycle\n  cycle: two\n",
            (2, 10),
            "stop condition #1 (tool_call_cycle), field `cycle`: invalid type: string \"two\", expected a cycle length",
        ),
    ];
    for (yaml, (line, column), message) in cases {
        let e = load_stop_conditions_yaml(yaml).unwrap_err();
        assert_eq!(pos(&e), (Some(*line), Some(*column)), "{yaml:?}: {e}");
        assert_eq!(e.message(), *message, "{yaml:?}");
    }
    let e =
        load_agent_spec_yaml("id: a\nstop_conditions:\n  - type: tool_call_cycle\n    cycle: 99\n")
            .unwrap_err();
    assert_eq!(pos(&e), (Some(4), Some(12)), "{e}");
    assert!(
        e.message()
            .contains("cycle must be 0 (disabled) or 1 to 16"),
        "{e}"
    );
}

fn spec_strategy() -> impl Strategy<Value = StopConditionSpec> {
    prop_oneof![
        (0usize..=1_000_000).prop_map(|rounds| StopConditionSpec::MaxRounds { rounds }),
        (0u64..=86_400).prop_map(|seconds| StopConditionSpec::Timeout { seconds }),
        (0usize..=1_000_000_000).prop_map(|max_total| StopConditionSpec::TokenBudget { max_total }),
        any::<u16>().prop_map(|n| StopConditionSpec::ConsecutiveErrors { max: n as usize }),
        "\\PC{0,20}".prop_map(|tool_name| StopConditionSpec::StopOnTool { tool_name }),
        prop_oneof![
            Just(String::new()),
            "[a-z ]{1,10}",
            "\\(\\?i\\)[a-z]{1,5}\\|done"
        ]
        .prop_map(|pattern| StopConditionSpec::ContentMatch { pattern }),
        prop_oneof![Just(0usize), 2usize..=64]
            .prop_map(|window| StopConditionSpec::LoopDetection { window }),
        (
            prop_oneof![Just(0usize), 2usize..100],
            0usize..=16,
            any::<bool>()
        )
            .prop_map(|(threshold, max_cycle, nudge)| {
                StopConditionSpec::ToolCallLoop {
                    threshold,
                    max_cycle,
                    on_detect: on_detect(nudge),
                }
            }),
        (
            prop_oneof![Just(0usize), 8usize..=1000],
            prop_oneof![Just(0usize), 2usize..100],
            any::<bool>()
        )
            .prop_map(|(chunk_chars, threshold, nudge)| {
                StopConditionSpec::ContentChanting {
                    chunk_chars,
                    threshold,
                    on_detect: on_detect(nudge),
                }
            }),
        (0usize..10).prop_map(|duplicates| StopConditionSpec::Stuck { duplicates }),
        (prop_oneof![Just(0usize), 2usize..=1000], any::<bool>()).prop_map(|(threshold, nudge)| {
            StopConditionSpec::ToolErrorLoop {
                threshold,
                on_detect: on_detect(nudge),
            }
        }),
        (
            0usize..=16,
            prop_oneof![Just(0usize), 2usize..=1000],
            any::<bool>()
        )
            .prop_map(|(cycle, threshold, nudge)| {
                StopConditionSpec::ToolCallCycle {
                    cycle,
                    threshold,
                    on_detect: on_detect(nudge),
                }
            }),
    ]
}

fn on_detect(nudge: bool) -> rein::contract::lifecycle::OnDetect {
    if nudge {
        rein::contract::lifecycle::OnDetect::NudgeThenStop
    } else {
        rein::contract::lifecycle::OnDetect::Stop
    }
}

proptest! {
    /// Every valid stop condition survives a YAML round trip, as a list and
    /// inside an agent spec.
    #[test]
    fn every_stop_condition_survives_a_yaml_round_trip(specs in prop::collection::vec(spec_strategy(), 0..8)) {
        let yaml = serde_yaml::to_string(&specs).unwrap();
        prop_assert_eq!(&load_stop_conditions_yaml(&yaml).unwrap(), &specs);
        let mut agent = AgentSpec::new("a").with_model_id("m");
        agent.stop_conditions = specs.clone();
        let yaml = serde_yaml::to_string(&agent).unwrap();
        prop_assert_eq!(load_agent_spec_yaml(&yaml).unwrap(), agent);
    }

    /// Arbitrary text never panics the loaders.
    #[test]
    fn loaders_never_panic(text in "\\PC{0,200}") {
        let _ = load_stop_conditions_yaml(&text);
        let _ = load_agent_spec_yaml(&text);
    }
}
