//! Project automation, run as `cargo xtask <command>`.
//!
//! - `ci`: the checks CI runs — `cargo fmt --check`, `cargo clippy` with
//!   `-D warnings`, every test of the workspace, and the doc tests.
//! - `local-llm start|stop|status|install`: a local OpenAI-compatible model
//!   server for the live tests (see `local_llm`).
//! - `bench [NAME…] [--json PATH] [--tiny]`: the benchmark workloads (see `bench`).

mod bench;
mod local_llm;

use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// The workspace's root directory.
pub(crate) fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("local-llm") => local_llm::main(&args[1..]),
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
  local-llm start [--port N]|stop|status|install
                                       a local model server for the live tests; start prints
                                       REIN_LLM_BASE_URL=<url> as its last line
  bench [NAME...] [--json PATH] [--tiny]
                                       release-mode benchmarks, median of 3 fresh processes;
                                       names: rounds rounds_policies rounds_events concurrent cancel
                                       cancel_open mailbox policies chanting";

/// Runs `cargo` with `args`, failing with the command line when it fails.
pub(crate) fn cargo(args: &[&str]) -> Result<(), String> {
    let line = format!("cargo {}", args.join(" "));
    println!("xtask: running `{line}`");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
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
        "--",
        "-D",
        "warnings",
    ])?;
    cargo(&["test", "--workspace", "--all-targets"])?;
    cargo(&["test", "--workspace", "--doc"])?;
    // The benchmarks are not run in CI, but each runs once at a tiny size so
    // they cannot rot.
    bench::main(&["--tiny".to_owned()])?;
    println!("xtask: ci passed");
    Ok(())
}
