//! `cargo xtask bench [NAME…] [--json PATH] [--tiny]`: builds the workloads of
//! `bench/` in release mode, runs each three times in fresh processes and
//! prints the median of every metric as `NAME metric value unit`.
//! `--tiny` runs each once at a tiny size (CI uses it so they cannot rot).

use std::collections::BTreeMap;
use std::process::Command;

/// The workloads, in order, with their names in the table.
pub(crate) const WORKLOADS: [(&str, &str); 9] = [
    ("rounds", "W1"),
    ("rounds_policies", "W1b"),
    ("rounds_events", "W1 with an event sink"),
    ("concurrent", "W2"),
    ("cancel", "W3"),
    ("cancel_open", "W3a"),
    ("mailbox", "W4"),
    ("policies", "W5"),
    ("chanting", "W6"),
];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) fn main(args: &[String]) -> Result<(), String> {
    let tiny = args.iter().any(|a| a == "--tiny");
    let json = args
        .windows(2)
        .find(|w| w[0] == "--json")
        .map(|w| w[1].clone());
    let mut names: Vec<String> = Vec::new();
    let mut skip_next = false;
    for a in args {
        if skip_next {
            skip_next = false;
        } else if a == "--json" {
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
    crate::cargo(&["build", "--quiet", "--profile", profile, "-p", "rein-bench"])?;
    let dir = if tiny { "debug" } else { "release" };
    let binary = crate::target_dir().join(dir).join("rein-bench");
    let repeats = if tiny { 1 } else { 3 };

    let mut results: BTreeMap<(usize, String), (Vec<f64>, String)> = BTreeMap::new();
    for (order, workload) in selected.iter().enumerate() {
        for _ in 0..repeats {
            let mut cmd = Command::new(&binary);
            cmd.arg(workload);
            if tiny {
                cmd.arg("--tiny");
            }
            let out = cmd
                .output()
                .map_err(|e| format!("could not run {}: {e}", binary.display()))?;
            if !out.status.success() {
                return Err(format!(
                    "workload {workload} failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let parts: Vec<&str> = line.split_whitespace().collect();
                let [name, metric, value, unit] = parts[..] else {
                    continue;
                };
                let Ok(value) = value.parse::<f64>() else {
                    continue;
                };
                results
                    .entry((order, format!("{name} {metric}")))
                    .or_insert_with(|| (Vec::new(), unit.to_owned()))
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
    Ok(())
}
