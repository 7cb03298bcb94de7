//! The deployment file's loader against valid and broken files: positions,
//! references, and every error reported at once.

use super::*;

const GOOD: &str = r#"
providers:
  local:   { kind: openai_compatible, base_url: "http://127.0.0.1:8080/v1/", api_key_env: LOCAL_KEY }
  hosted:
    kind: genai
    limits: { requests_per_minute: 500, tokens_per_minute: 200000, max_concurrent: 16 }
  offline: { kind: scripted, responses: ["Hello from Rein."] }
  slow:
    kind: scripted
    chunk_delay_ms: 50
    responses:
      - "a long answer"
      - { text: "Let me look.", tool_calls: [ { name: terminate, arguments: { reason: done } } ], delay_ms: 5 }
      - { error: "quota exceeded" }
models:
  small: { provider: local, model: smollm2, temperature: 0, max_output_tokens: 256 }
  demo: { provider: offline, model: script }
mcp_servers:
  everything: { command: npx, args: ["-y", "@modelcontextprotocol/server-everything"], env: {} }
  remote:     { url: "http://127.0.0.1:9000/mcp" }
agents:
  - id: assistant
    model_id: small
    system_prompt: "You are terse."
    max_rounds: 8
    plugin_ids: [terminate]
    tools: [everything__echo]
    stop_conditions: [ { type: timeout, seconds: 120 } ]
  - id: demo
    model_id: demo
store: memory
server:
  retention: { max_finished_runs: 5 }
"#;

fn errors(text: &str) -> Vec<String> {
    match Deployment::from_yaml(text) {
        Ok(d) => panic!("loaded: {d:?}"),
        Err(e) => e.lines(),
    }
}

#[test]
fn the_documented_file_loads() {
    let d = Deployment::from_yaml(GOOD).unwrap();
    assert_eq!(d.providers.len(), 4);
    assert_eq!(
        d.providers["local"],
        ProviderConfig::OpenaiCompatible {
            base_url: "http://127.0.0.1:8080/v1/".into(),
            api_key_env: Some("LOCAL_KEY".into()),
            limits: None,
        }
    );
    assert_eq!(
        d.providers["hosted"].limits(),
        Some(
            &rein::limits::ProviderLimits::new()
                .requests_per_minute(500)
                .tokens_per_minute(200_000)
                .max_concurrent(16)
        )
    );
    assert_eq!(d.models["small"].temperature, Some(0.0));
    assert_eq!(d.agents[0].spec.max_rounds, 8);
    assert_eq!(d.agents[0].tools, vec!["everything__echo"]);
    assert_eq!(d.agents[0].spec.stop_conditions.len(), 1);
    assert_eq!(d.agents[1].tools, Vec::<String>::new());
    assert_eq!(d.store, StoreConfig::Memory);
    assert_eq!(d.server.retention.max_finished_runs, 5);
    assert_eq!(d.server.retention.finished_run_ttl_seconds, 3600);
    let ProviderConfig::Scripted { responses, .. } = &d.providers["slow"] else {
        panic!()
    };
    assert_eq!(responses.len(), 3);
}

#[test]
fn unknown_ids_are_each_reported_at_their_value_with_the_known_ones() {
    let text = "providers:\n  p: { kind: genai }\nmodels:\n  m: { provider: nope, model: x }\nagents:\n  - id: a\n    model_id: missing\n    plugin_ids: [terminate, bogus]\n    tools: [ghost__echo, plain]\n";
    let lines = errors(text);
    assert_eq!(
        lines,
        vec![
            "<text>:4:18: model \"m\": unknown provider \"nope\"; known providers: p",
            "<text>:7:15: agent \"a\": unknown model \"missing\"; known models: m",
            "<text>:8:29: agent \"a\": unknown plugin \"bogus\"; known plugins: terminate, ask_user, automation, plan, outputs",
            "<text>:9:13: agent \"a\": tool \"ghost__echo\" names unknown MCP server \"ghost\"; known MCP servers: none",
            "<text>:9:26: agent \"a\": unknown tool \"plain\"; tools listed here come from MCP servers, named \"<server id>__<tool>\" (known MCP servers: none); Rust tools need a binary that adds them (rein_server::App); plugin tools come with plugin_ids",
        ]
    );
}

#[test]
fn structural_errors_keep_their_positions() {
    let lines = errors("providers:\n  p: { kind: genai }\nmodelz: {}\n");
    assert_eq!(lines.len(), 1);
    assert!(lines[0].starts_with("<text>:3:1: "), "{lines:?}");
    assert!(lines[0].contains("unknown field `modelz`"), "{lines:?}");

    let lines = errors(
        "providers: {}\nmodels: {}\nagents:\n  - id: a\n    model_id: m\n    stop_conditions:\n      - { type: timeout, secondz: 3 }\n",
    );
    assert!(lines[0].starts_with("<text>:7:26: "), "{lines:?}");
    assert!(lines[0].contains("unknown field `secondz`"), "{lines:?}");

    let lines =
        errors("providers: {}\nmodels: {}\nagents:\n  - id: a\n    model_id: m\n    colour: red\n");
    assert!(lines[0].contains("unknown field `colour`"), "{lines:?}");
    assert!(lines[0].starts_with("<text>:6:5: "), "{lines:?}");

    let lines = errors("providers:\n  p: { kind: cloud }\n");
    assert!(lines[0].contains("unknown variant `cloud`"), "{lines:?}");
}

#[test]
fn an_mcp_server_needs_a_command_or_a_url_and_no_agents_is_an_error() {
    let lines = errors("mcp_servers:\n  s: { args: [] }\nagents: []\n");
    assert!(
        lines[0].contains("MCP server \"s\": give either"),
        "{lines:?}"
    );
    assert!(lines[1].contains("defines no agents"), "{lines:?}");
}

#[test]
fn an_invalid_regex_is_reported_by_the_stop_condition_loader() {
    let lines = errors(
        "providers: {}\nmodels: {}\nagents:\n  - id: a\n    stop_conditions: [ { type: content_match, pattern: \"(\" } ]\n",
    );
    assert!(lines[0].contains("pattern"), "{lines:?}");
    assert!(lines[0].starts_with("<text>:5:"), "{lines:?}");
}

#[test]
fn artifacts_follow_the_store_unless_the_file_chooses() {
    const BASE: &str = "providers:\n  p: { kind: genai }\nmodels:\n  m: { provider: p, model: gpt-4o-mini }\nagents:\n  - id: a\n    model_id: m\n    context: { window_tokens: 8000, offload: { min_tokens: 500 } }\n";
    let d = Deployment::from_yaml(BASE).unwrap();
    assert_eq!(d.artifacts, None);
    assert_eq!(d.artifact_store(), ArtifactsConfig::Memory);
    let policy = d.agents[0].spec.context.as_ref().expect("context loads");
    assert_eq!(policy.window_tokens, 8000);
    let durable = format!("{BASE}store: {{ postgres: {{ url_env: DB }} }}\n");
    let d = Deployment::from_yaml(&durable).unwrap();
    assert_eq!(d.artifact_store(), ArtifactsConfig::Postgres);
    for (line, want) in [
        ("artifacts: memory", ArtifactsConfig::Memory),
        ("artifacts: postgres", ArtifactsConfig::Postgres),
        (
            "artifacts: { dir: /var/lib/rein/artifacts }",
            ArtifactsConfig::Dir {
                path: "/var/lib/rein/artifacts".into(),
            },
        ),
    ] {
        let d = Deployment::from_yaml(&format!("{durable}{line}\n")).unwrap();
        assert_eq!(d.artifact_store(), want, "{line}");
    }
}

#[test]
fn a_bad_artifacts_value_is_an_error_at_its_position() {
    const BASE: &str = "providers:\n  p: { kind: genai }\nmodels:\n  m: { provider: p, model: gpt-4o-mini }\nagents:\n  - { id: a, model_id: m }\n";
    let lines = errors(&format!("{BASE}artifacts: disk\n"));
    assert!(lines[0].starts_with("<text>:7:"), "{lines:?}");
    assert!(
        lines[0].contains("`memory`, `postgres` or `{ dir: PATH }`"),
        "{lines:?}"
    );
    let lines = errors(&format!("{BASE}artifacts: {{ dri: x }}\n"));
    assert!(lines[0].contains("unknown field `dri`"), "{lines:?}");
    let lines = errors(&format!("{BASE}artifacts: {{ dir: \"\" }}\n"));
    assert!(lines[0].contains("`dir` is empty"), "{lines:?}");
    // PostgreSQL artifacts need the PostgreSQL store.
    let lines = errors(&format!("{BASE}artifacts: postgres\n"));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with("<text>:7:12: "), "{lines:?}");
    assert!(lines[0].contains("the store is `memory`"), "{lines:?}");
}

#[test]
fn an_agent_s_context_policy_is_checked_with_its_position() {
    let lines = errors(
        "providers:\n  p: { kind: genai }\nmodels:\n  m: { provider: p, model: gpt-4o-mini }\nagents:\n  - id: a\n    model_id: m\n    context: { window_tokens: 8000, compact: { at: 1.5 } }\n",
    );
    assert!(lines[0].starts_with("<text>:8:"), "{lines:?}");
    assert!(lines[0].contains("at"), "{lines:?}");
}

#[test]
fn a_genai_model_name_no_provider_claims_is_a_load_error_at_its_value() {
    let text = "providers:\n  p: { kind: genai }\nmodels:\n  typo: { provider: p, model: claud-sonnet-4 }\n  ok: { provider: p, model: claude-sonnet-4 }\n  spaced: { provider: p, model: \"anthropic::claud-x\" }\n  local: { provider: p, model: \"ollama::llama3\" }\nagents:\n  - { id: a, model_id: ok }\n";
    let lines = errors(text);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("<text>:4:31: model \"typo\": the `genai` provider cannot tell which provider serves \"claud-sonnet-4\""),
        "{lines:?}"
    );
    assert!(lines[0].contains("`ollama::claud-sonnet-4`"), "{lines:?}");
}

#[test]
fn sub_agents_load_and_an_unknown_one_or_a_cycle_is_an_error_at_its_entry() {
    let good = "providers:\n  p: { kind: scripted, responses: [hi] }\nmodels:\n  m: { provider: p, model: x }\nagents:\n  - id: lead\n    model_id: m\n    subagents:\n      - agent: researcher\n        tool: research\n        description: \"Research one question.\"\n        context: shared\n        outputs: { summary: string, sources: array }\n        max_rounds: 8\n        timeout_seconds: 120\n        token_budget: 20000\n  - { id: researcher, model_id: m }\n";
    let d = Deployment::from_yaml(good).unwrap();
    let entry = &d.agents[0].spec.subagents[0];
    assert_eq!(entry.tool_name(), "research");
    assert_eq!(entry.context, rein::SubagentContext::Shared);
    assert_eq!(entry.outputs["sources"], "array");
    assert_eq!(entry.max_rounds, Some(8));

    let bad = "providers:\n  p: { kind: scripted, responses: [hi] }\nmodels:\n  m: { provider: p, model: x }\nagents:\n  - id: a\n    model_id: m\n    subagents: [ { agent: b }, { agent: ghost } ]\n  - id: b\n    model_id: m\n    subagents:\n      - { agent: a, outputs: { n: float } }\n";
    let lines = errors(bad);
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(
        lines.iter().any(|l| l.starts_with("<text>:8:41: agent \"a\": sub-agent \"ghost\" is not an agent of this file; known agents: a, b")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("output \"n\": unknown JSON type \"float\"")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l
                .starts_with("<text>:12:18: sub-agents reach their own agent again: a → b → a")),
        "{lines:?}"
    );
    let typo = errors(
        "providers:\n  p: { kind: scripted, responses: [hi] }\nmodels:\n  m: { provider: p, model: x }\nagents:\n  - id: a\n    model_id: m\n    subagents: [ { agnt: b } ]\n",
    );
    assert!(typo[0].contains("agnt"), "{typo:?}");
}

#[test]
fn provider_limits_out_of_bounds_are_refused_at_their_key() {
    let lines = errors(
        "providers:\n  p:\n    kind: scripted\n    responses: [hi]\n    limits: { requests_per_minute: 60, max_concurrent: 0 }\nmodels:\n  m: { provider: p, model: x }\nagents:\n  - { id: a, model_id: m }\n",
    );
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("<text>:5:56: provider \"p\": limits: max_concurrent is 0"),
        "{lines:?}"
    );
    let lines = errors(
        "providers:\n  p:\n    kind: scripted\n    responses: [hi]\n    limits: { requests_per_minit: 60 }\nmodels:\n  m: { provider: p, model: x }\nagents:\n  - { id: a, model_id: m }\n",
    );
    assert!(
        // A misspelled key is reported at its provider (serde reads a
        // tagged provider as a whole), naming the keys that exist.
        lines[0].starts_with("<text>:2:3:")
            && lines[0].contains(
                "unknown field `requests_per_minit`, expected one of `requests_per_minute`"
            ),
        "{lines:?}"
    );
}

#[test]
fn a_fallback_that_is_no_model_of_the_file_is_refused_at_its_value() {
    let lines = errors(
        "providers:\n  p: { kind: scripted, responses: [hi] }\nmodels:\n  m: { provider: p, model: x, fallbacks: [small, m] }\n  small: { provider: p, model: y }\nagents:\n  - { id: a, model_id: m }\n",
    );
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("<text>:4:50: model \"m\": fallback \"m\" is the model itself"),
        "{lines:?}"
    );
    let lines = errors(
        "providers:\n  p: { kind: scripted, responses: [hi] }\nmodels:\n  m: { provider: p, model: x, fallbacks: [smal] }\nagents:\n  - { id: a, model_id: m }\n",
    );
    assert!(
        lines[0].starts_with("<text>:4:43: model \"m\": fallback \"smal\" is not a model of this file; known models: m"),
        "{lines:?}"
    );
}

/// The keys the loader accepts where `yaml` puts an unknown key `bogus`
/// (or type `bogus`), read from its error's "expected …" list.
fn accepted_keys(yaml: &str) -> Vec<String> {
    let error = Deployment::from_yaml(yaml).unwrap_err().to_string();
    let expected = error
        .split_once("expected")
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("{yaml}: no list of keys in {error}"));
    let quoted: Vec<String> = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    if !quoted.is_empty() {
        return quoted;
    }
    // Stop condition types: "expected one of: a, b, c".
    expected
        .trim_start_matches(" one of:")
        .split(',')
        .map(|k| k.trim().to_owned())
        .collect()
}

#[test]
fn the_reference_page_documents_every_key_the_loader_accepts() {
    let reference = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/deployment.md"
    ))
    .unwrap();
    let probes = [
        "bogus: 1",
        "providers: { p: { kind: openai_compatible, base_url: x, bogus: 1 } }",
        "providers: { p: { kind: scripted, bogus: 1 } }",
        "providers: { p: { kind: genai, limits: { bogus: 1 } } }",
        "models: { m: { provider: p, model: x, bogus: 1 } }",
        "mcp_servers: { s: { command: x, bogus: 1 } }",
        "server: { bogus: 1 }",
        "server: { auth: { bogus: 1 } }",
        "server: { cors: { bogus: 1 } }",
        "server: { connections: { bogus: 1 } }",
        "server: { retention: { bogus: 1 } }",
        "store: { bogus: 1 }",
        "store: { postgres: { bogus: 1 } }",
        "artifacts: { bogus: 1 }",
        "agents: [ { id: a, bogus: 1 } ]",
        "agents: [ { id: a, subagents: [ { agent: b, bogus: 1 } ] } ]",
        "agents: [ { id: a, context: { bogus: 1 } } ]",
        "agents: [ { id: a, context: { offload: { bogus: 1 } } } ]",
        "agents: [ { id: a, context: { compact: { bogus: 1 } } } ]",
        "agents: [ { id: a, context: { summarize: { bogus: 1 } } } ]",
        "agents: [ { id: a, approvals: [ { tool: x, bogus: 1 } ] } ]",
        "agents: [ { id: a, stop_conditions: [ { type: bogus } ] } ]",
    ];
    let mut missing = Vec::new();
    let mut checked = 0;
    for probe in probes {
        let keys = accepted_keys(probe);
        assert!(!keys.is_empty(), "{probe}");
        for key in keys {
            checked += 1;
            // A key of its own row (`key`), or a nested one (`section.key`).
            if !reference.contains(&format!("`{key}`")) && !reference.contains(&format!(".{key}`"))
            {
                missing.push(format!("{key} (from {probe})"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/deployment.md does not document: {missing:#?}"
    );
    assert!(checked > 80, "only {checked} keys were found");
}
