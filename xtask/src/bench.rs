//! `cargo xtask bench [NAME…] [--json PATH] [--tiny]`: builds the workloads of
//! `bench/` in release mode, runs each three times in fresh processes and
//! prints the median of every metric as `NAME metric value unit`.
//! `--tiny` runs each once at a tiny size (CI uses it so they cannot rot).
//! A workload process that runs longer than `--timeout SECS` (default 120)
//! is killed and reported as failed; the others still run and are reported.

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The workloads, in order, with their names in the table
/// (`external`: driven from the thread that owns the runtime, not a worker).
pub(crate) const WORKLOADS: [(&str, &str); 37] = [
    ("rounds", "W1"),
    ("rounds_external", "W1 external"),
    ("rounds_policies", "W1b"),
    ("rounds_loops", "W1b with every loop detector"),
    ("rounds_control", "W1b with every run-control feature"),
    ("rounds_events", "W1 with an event sink"),
    ("concurrent", "W2"),
    ("context", "W11"),
    ("cancel", "W3"),
    ("cancel_pause", "W3 with a 1 ms pause"),
    ("cancel_external", "W3 external"),
    ("cancel_external_pause", "W3 external with a 1 ms pause"),
    ("cancel_open", "W3a"),
    ("mailbox", "W4"),
    ("mailbox_external", "W4 external"),
    ("policies", "W5"),
    ("chanting", "W6"),
    ("chanting_spaces", "W6 on spaces"),
    ("chanting_rules", "W6 on rule characters"),
    ("http", "W7"),
    ("http_auth", "W7 with auth on, against W7 interleaved"),
    ("http_first_event", "W7b"),
    ("http_retention", "retention after 100 000 runs"),
    ("subagent_cancel", "W12"),
    ("subagent_overhead", "W12b"),
    ("approval_resume", "W13a"),
    ("approval_parked_memory", "W13c"),
    ("limits", "W14"),
    ("cluster_cancel", "W8"),
    ("cluster_submit", "W9 one hot thread"),
    ("cluster_submit_spread", "W9 over 64 threads"),
    (
        "cluster_submit_spread_held",
        "W9 over 64 threads, acceptance alone",
    ),
    ("cluster_takeover", "W10"),
    ("cluster_approval", "W13b"),
    ("cluster_parked_memory", "W13c in the service"),
    ("cluster_limits", "W14 on PostgreSQL"),
    (
        "cluster_approval_lost_notify",
        "W13b with the notification lost",
    ),
];

/// `--compare REV`: builds `rev` and runs both sides interleaved.
#[allow(clippy::too_many_arguments)]
fn compare_with(
    rev: &str,
    binary: &std::path::Path,
    envs: &[(String, String)],
    selected: &[&str],
    profile: &str,
    rounds: usize,
    tiny: bool,
    timeout: Duration,
) -> Result<(), String> {
    let cluster = selected.iter().any(|w| w.starts_with("cluster_"));
    let old = crate::compare::build_revision(rev, profile, cluster)?;
    let rein = envs
        .iter()
        .find(|(k, _)| k == "REIN_BIN")
        .map(|(_, v)| std::path::PathBuf::from(v));
    let this = crate::compare::Side {
        label: "this tree".to_owned(),
        bench: binary.to_path_buf(),
        rein,
    };
    let envs: Vec<(String, String)> = envs
        .iter()
        .filter(|(k, _)| k != "REIN_BIN")
        .cloned()
        .collect();
    crate::compare::run(&[old, this], &envs, selected, rounds, tiny, timeout)
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) fn main(args: &[String]) -> Result<(), String> {
    let tiny = args.iter().any(|a| a == "--tiny");
    let option = |name: &str| args.windows(2).find(|w| w[0] == name).map(|w| w[1].clone());
    let json = option("--json");
    let compare = option("--compare");
    let rounds = match option("--rounds") {
        Some(r) => r
            .parse::<usize>()
            .ok()
            .filter(|r| *r > 0)
            .ok_or_else(|| format!("--rounds takes a number of rounds, not \"{r}\""))?,
        None => 5,
    };
    let timeout = match option("--timeout") {
        Some(t) => Duration::from_secs(
            t.parse()
                .map_err(|_| format!("--timeout takes seconds, not \"{t}\""))?,
        ),
        None => Duration::from_secs(120),
    };
    let mut names: Vec<String> = Vec::new();
    let mut skip_next = false;
    for a in args {
        if skip_next {
            skip_next = false;
        } else if a == "--json" || a == "--timeout" || a == "--compare" || a == "--rounds" {
            skip_next = true;
        } else if !a.starts_with("--") {
            names.push(a.clone());
        }
    }
    for n in &names {
        if !WORKLOADS.iter().any(|(w, _)| w == n) {
            let known: Vec<&str> = WORKLOADS.iter().map(|(w, _)| *w).collect();
            return Err(format!(
                "unknown workload \"{n}\"; known: {}",
                known.join(", ")
            ));
        }
    }
    let selected: Vec<&str> = WORKLOADS
        .iter()
        .map(|(w, _)| *w)
        .filter(|w| names.is_empty() || names.iter().any(|n| n == w))
        .collect();

    let profile = if tiny { "dev" } else { "release" };
    let built = crate::cargo_build_executable(
        &["--quiet", "--profile", profile, "-p", "rein-bench"],
        "rein-bench",
    )?;
    // Run a private copy: a target directory shared with other checkouts
    // (CARGO_TARGET_DIR) may get another build of rein-bench meanwhile.
    let binary = std::env::temp_dir().join(format!("rein-bench-{}", std::process::id()));
    std::fs::copy(&built, &binary).map_err(|e| {
        format!(
            "cannot copy {} to {}: {e}",
            built.display(),
            binary.display()
        )
    })?;
    // The cluster workloads run real `rein serve` processes.
    // W7 with auth on: the server's tokens and the clients' one.
    let mut envs = vec![(
        "REIN_BENCH_TOKENS".to_owned(),
        "bench=bench-token-0123456789abcdef".to_owned(),
    )];
    if selected.iter().any(|w| w.starts_with("cluster_")) {
        if std::env::var("REIN_DATABASE_URL").is_err() {
            let _ = std::fs::remove_file(&binary);
            return Err("the cluster workloads need REIN_DATABASE_URL: run `cargo xtask postgres start` and export what it prints".to_owned());
        }
        let rein = crate::cargo_build_executable(
            &[
                "--quiet",
                "--profile",
                profile,
                "-p",
                "rein-server",
                "--bin",
                "rein",
            ],
            "rein",
        )?;
        envs.push(("REIN_BIN".to_owned(), rein.display().to_string()));
    }
    let result = match compare {
        Some(rev) => compare_with(
            &rev, &binary, &envs, &selected, profile, rounds, tiny, timeout,
        ),
        None => run_all(&binary, &envs, &selected, tiny, timeout, json),
    };
    let _ = std::fs::remove_file(&binary);
    result
}

/// Runs the selected workloads with `binary` and reports their medians.
fn run_all(
    binary: &std::path::Path,
    envs: &[(String, String)],
    selected: &[&str],
    tiny: bool,
    timeout: Duration,
    json: Option<String>,
) -> Result<(), String> {
    let repeats = if tiny { 1 } else { 3 };

    let mut results: BTreeMap<(usize, String), (Vec<f64>, String)> = BTreeMap::new();
    let mut failed = Vec::new();
    for (order, workload) in selected.iter().enumerate() {
        for _ in 0..repeats {
            let mut cmd = Command::new(binary);
            cmd.arg(workload).envs(envs.iter().map(|(k, v)| (k, v)));
            if tiny {
                cmd.arg("--tiny");
            }
            let stdout = match run_bounded(cmd, timeout) {
                Ok(stdout) => stdout,
                Err(e) => {
                    eprintln!("xtask: workload {workload} failed: {e}");
                    failed.push(*workload);
                    break;
                }
            };
            for (figure, value, unit) in parse_metrics(&stdout) {
                results
                    .entry((order, figure))
                    .or_insert_with(|| (Vec::new(), unit))
                    .0
                    .push(value);
            }
        }
    }
    let mut rows = Vec::new();
    for ((_, key), (values, unit)) in results {
        let m = median(values);
        println!("{key} {m:.3} {unit}");
        rows.push(format!(
            "  {{\"metric\": \"{key}\", \"value\": {m}, \"unit\": \"{unit}\"}}"
        ));
    }
    if let Some(path) = json {
        std::fs::write(&path, format!("[\n{}\n]\n", rows.join(",\n")))
            .map_err(|e| format!("cannot write {path}: {e}"))?;
        eprintln!("xtask: wrote {path}");
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("workloads failed: {}", failed.join(", ")))
    }
}

/// The figures a workload printed, one per line `NAME METRIC VALUE UNIT`:
/// (`NAME METRIC`, value, unit); other lines are skipped.
pub(crate) fn parse_metrics(stdout: &str) -> Vec<(String, f64, String)> {
    stdout
        .lines()
        .filter_map(|line| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            let [name, metric, value, unit] = parts[..] else {
                return None;
            };
            let value = value.parse::<f64>().ok()?;
            Some((format!("{name} {metric}"), value, unit.to_owned()))
        })
        .collect()
}

/// Runs `cmd` and returns its standard output, or an error with its standard
/// error when it fails, or when it runs longer than `timeout` (it is then
/// killed).
pub(crate) fn run_bounded(mut cmd: Command, timeout: Duration) -> Result<String, String> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not run {cmd:?}: {e}"))?;
    // Drain both pipes on their own threads so a chatty child never blocks.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if start.elapsed() >= timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("could not wait for {cmd:?}: {e}")),
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    match status {
        None => Err(format!("killed after {} s (--timeout)", timeout.as_secs())),
        Some(status) if status.success() => Ok(stdout),
        Some(status) => Err(format!("{status}: {}", stderr.trim())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workload_s_figures_are_read_from_its_metric_lines_only() {
        let stdout = "warming up\nrounds per_round_us 3.25 µs\nhttp runs_per_sec 12504.5 runs/s\nrounds note not-a-number x\n";
        assert_eq!(
            parse_metrics(stdout),
            vec![
                ("rounds per_round_us".to_owned(), 3.25, "µs".to_owned()),
                ("http runs_per_sec".to_owned(), 12504.5, "runs/s".to_owned()),
            ]
        );
    }

    #[test]
    fn the_median_is_the_middle_value_whatever_the_order() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![5.0]), 5.0);
    }
}
