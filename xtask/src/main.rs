//! Project automation, run as `cargo xtask <command>`.
//!
//! - `ci`: the checks CI runs — `cargo fmt --check`, `cargo clippy` with
//!   `-D warnings`, every test of the workspace, and the doc tests (all
//!   with every feature, so the `otel` exporter is checked too).
//! - `local-llm start|stop|status|install`: a local OpenAI-compatible model
//!   server for the live tests (see `local_llm`).
//! - `postgres start [--private]|stop|restart|status`: a PostgreSQL cluster
//!   for the durable-mode tests: the shared one, or with `--private` a fresh
//!   one of its own that `stop` deletes (`.ci/run` uses it; see `postgres`).
//! - `bench [NAME…] [--json PATH] [--tiny] [--timeout SECS]`: the benchmark
//!   workloads (see `bench`); with `--compare REV [--rounds N]`, against
//!   another revision's, interleaved, with ratios (see `compare`).

mod bench;
mod compare;
mod local_llm;
mod postgres;

use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// The workspace's root directory.
pub(crate) fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// Builds with `cargo build ARGS` and returns the path of the executable
/// `name` as cargo reports it (`--message-format=json`), so wherever cargo
/// puts it — `CARGO_TARGET_DIR`, `build.target-dir` or `build.target` in a
/// config file, a profile's own directory — is where it is run from.
pub(crate) fn cargo_build_executable(args: &[&str], name: &str) -> Result<PathBuf, String> {
    let line = format!("cargo build {}", args.join(" "));
    println!("xtask: running `{line}`");
    let out = Command::new(cargo_program())
        .arg("build")
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("could not start `{line}`: {e}"))?;
    if !out.status.success() {
        return Err(format!("`{line}` failed ({})", out.status));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| json_string_field(l, "reason").as_deref() == Some("compiler-artifact"))
        .filter_map(|l| json_string_field(l, "executable").map(PathBuf::from))
        .rfind(|path| path.file_name().is_some_and(|f| f == name))
        .ok_or_else(|| format!("`{line}` reported no executable named {name}"))
}

/// The string value of `key` in a JSON text's top-level object.
fn json_string_field(json: &str, key: &str) -> Option<String> {
    // Cargo's messages are one object per line; a string value is decoded,
    // any other value (e.g. `null`) is `None`.
    let mut chars = json.chars();
    let mut depth = 0usize;
    // The last character outside strings that is not whitespace: a string
    // right after `{` or `,` in the top-level object is one of its keys.
    let mut last = ' ';
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                let s = json_string_rest(&mut chars)?;
                if depth == 1 && matches!(last, '{' | ',') && s == key {
                    let value = chars.as_str().trim_start().strip_prefix(':')?;
                    let mut value = value.trim_start().strip_prefix('"')?.chars();
                    return json_string_rest(&mut value);
                }
                last = '"';
            }
            '{' | '[' => {
                depth += 1;
                last = c;
            }
            '}' | ']' => {
                depth = depth.checked_sub(1)?;
                last = c;
            }
            c if c.is_whitespace() => {}
            c => last = c,
        }
    }
    None
}

/// Reads a JSON string whose opening quote is consumed, up to and including
/// its closing quote, decoding escapes.
fn json_string_rest(chars: &mut std::str::Chars<'_>) -> Option<String> {
    let mut value = String::new();
    loop {
        match chars.next()? {
            '"' => return Some(value),
            '\\' => match chars.next()? {
                'n' => value.push('\n'),
                't' => value.push('\t'),
                'r' => value.push('\r'),
                'b' => value.push('\u{8}'),
                'f' => value.push('\u{c}'),
                'u' => {
                    let unit = hex4(chars)?;
                    if (0xD800..0xDC00).contains(&unit) {
                        // A surrogate pair: `\uD8xx\uDCxx`.
                        if chars.next()? != '\\' || chars.next()? != 'u' {
                            return None;
                        }
                        let low = hex4(chars)?.checked_sub(0xDC00)?;
                        value.push(char::from_u32(0x10000 + ((unit - 0xD800) << 10) + low)?);
                    } else {
                        value.push(char::from_u32(unit)?);
                    }
                }
                other => value.push(other),
            },
            c => value.push(c),
        }
    }
}

fn hex4(chars: &mut std::str::Chars<'_>) -> Option<u32> {
    let hex: String = chars.by_ref().take(4).collect();
    u32::from_str_radix(&hex, 16).ok()
}

fn cargo_program() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("local-llm") => local_llm::main(&args[1..]),
        Some("postgres") => postgres::main(&args[1..]),
        Some("bench") => bench::main(&args[1..]),
        Some("help") | Some("--help") | Some("-h") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command \"{other}\"\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

const USAGE: &str = "usage: cargo xtask <command>

commands:
  ci                                   fmt check, clippy -D warnings, all tests, doc tests
  local-llm start [--port N] [--n-ctx N]|stop|status|install
                                       a local model server for the live tests; start prints
                                       REIN_LLM_BASE_URL=<url> as its last line
  postgres start [--private]|stop|restart|status
                                       a PostgreSQL cluster (127.0.0.1, free port); start
                                       prints REIN_DATABASE_URL=<url> as its last line. Without
                                       --private: the user's shared cluster, kept between runs.
                                       --private: a fresh cluster of its own (for CI), also
                                       printing REIN_PG_DIR=<dir>; with REIN_PG_DIR exported,
                                       stop|restart|status act on it and stop deletes it
  bench [NAME...] [--json PATH] [--tiny] [--timeout SECS] [--compare REV [--rounds N]]
                                       release-mode benchmarks, median of 3 fresh processes,
                                       or with --compare, this tree against revision REV
                                       (built under target/bench-compare), N rounds
                                       (default 5) interleaved, with each figure's ratio;
                                       each killed after SECS (default 120); names: rounds
                                       rounds_external rounds_policies rounds_loops rounds_control rounds_events concurrent
                                       cancel cancel_pause cancel_external cancel_external_pause
                                       cancel_open mailbox mailbox_external policies chanting
                                       chanting_spaces chanting_rules http http_auth http_first_event
                                       http_retention subagent_cancel subagent_overhead
                                       approval_resume approval_parked_memory limits,
                                       cluster_cancel, cluster_submit,
                                       cluster_submit_spread, cluster_submit_spread_held,
                                       cluster_takeover, cluster_approval, cluster_limits,
                                       cluster_approval_lost_notify,
                                       cluster_parked_memory (these need
                                       REIN_DATABASE_URL)";

/// Runs `cargo` with `args`, failing with the command line when it fails.
pub(crate) fn cargo(args: &[&str]) -> Result<(), String> {
    let line = format!("cargo {}", args.join(" "));
    println!("xtask: running `{line}`");
    let status = Command::new(cargo_program())
        .args(args)
        .status()
        .map_err(|e| format!("could not start `{line}`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{line}` failed ({status})"))
    }
}

fn ci() -> Result<(), String> {
    cargo(&["fmt", "--all", "--", "--check"])?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--all-features",
        "--",
        "-D",
        "warnings",
    ])?;
    // All features: the `otel` exporter is built and tested too.
    cargo(&["test", "--workspace", "--all-targets", "--all-features"])?;
    cargo(&["test", "--workspace", "--doc", "--all-features"])?;
    // The benchmarks are not run in CI, but each runs once at a tiny size so
    // they cannot rot.
    bench::main(&["--tiny".to_owned()])?;
    println!("xtask: ci passed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::json_string_field;

    #[test]
    fn reads_a_json_string_field_with_escapes() {
        let json = r#"{"packages":[{"metadata":{"target_directory":"no"},"d":"\"target_directory\":\"no\""}],
            "target_directory" : "/a \"b\"\\c\u00e9\ud83d\ude00","version":1}"#;
        assert_eq!(
            json_string_field(json, "target_directory").as_deref(),
            Some("/a \"b\"\\c\u{e9}\u{1f600}")
        );
        assert_eq!(json_string_field(json, "missing"), None);
        let artifact = r#"{"reason":"compiler-artifact","target":{"name":"x","executable":"no"},"executable":null}"#;
        assert_eq!(
            json_string_field(artifact, "reason").as_deref(),
            Some("compiler-artifact")
        );
        assert_eq!(json_string_field(artifact, "executable"), None);
    }
}
