//! `cargo xtask bench --compare REV`: the workloads of this tree against
//! those of another revision, in one run, interleaved, with the ratio of
//! each figure — the form a performance claim takes.
//!
//! The revision's sources are exported (`git archive`) to
//! `target/bench-compare/<sha>/src` and built there in a target directory
//! of their own, kept for the next comparison with the same revision.
//! Then each round runs every workload on both sides, one fresh process
//! each, the side that goes first alternating round by round, so a drift
//! of the machine (another job, a thermal or frequency change) falls on
//! both alike. A figure is the median over the rounds; a workload the
//! revision does not have is reported as missing there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::bench::{median, parse_metrics, run_bounded};

/// One side of a comparison: its label and its executables.
pub(crate) struct Side {
    /// `this tree` or the revision's short hash.
    pub(crate) label: String,
    /// Its `rein-bench`.
    pub(crate) bench: PathBuf,
    /// Its `rein` (for the cluster workloads).
    pub(crate) rein: Option<PathBuf>,
}

/// Exports and builds `rev`'s `rein-bench` (and `rein` with `cluster`).
pub(crate) fn build_revision(rev: &str, profile: &str, cluster: bool) -> Result<Side, String> {
    let root = crate::workspace_root();
    let sha = git(
        &root,
        &["rev-parse", "--verify", &format!("{rev}^{{commit}}")],
    )?;
    let short = sha.get(..12).unwrap_or(&sha).to_owned();
    let base = root.join("target").join("bench-compare").join(&short);
    let src = base.join("src");
    if !src.join("Cargo.toml").exists() {
        std::fs::create_dir_all(&src)
            .map_err(|e| format!("cannot create {}: {e}", src.display()))?;
        println!("xtask: exporting {rev} ({short}) to {}", src.display());
        let archive = Command::new("git")
            .current_dir(&root)
            .args(["archive", "--format=tar", &sha])
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("could not run git archive: {e}"))?;
        let status = Command::new("tar")
            .current_dir(&src)
            .arg("-x")
            .stdin(archive.stdout.ok_or("git archive gave no output")?)
            .status()
            .map_err(|e| format!("could not run tar: {e}"))?;
        if !status.success() {
            let _ = std::fs::remove_dir_all(&src);
            return Err(format!("exporting {rev} failed ({status})"));
        }
    }
    let target = base.join("target");
    let bench = build_in(&src, &target, &["-p", "rein-bench"], profile, "rein-bench")?;
    let rein = if cluster {
        Some(build_in(
            &src,
            &target,
            &["-p", "rein-server", "--bin", "rein"],
            profile,
            "rein",
        )?)
    } else {
        None
    };
    Ok(Side {
        label: short,
        bench,
        rein,
    })
}

/// `cargo build` in `dir` with its own target directory; the executable.
fn build_in(
    dir: &Path,
    target: &Path,
    args: &[&str],
    profile: &str,
    name: &str,
) -> Result<PathBuf, String> {
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()));
    command
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target)
        .args(["build", "--quiet", "--profile", profile])
        .args(args);
    // The toolchain this xtask runs on, whatever the revision's file says.
    if let Ok(toolchain) = std::env::var("RUSTUP_TOOLCHAIN") {
        command.env("RUSTUP_TOOLCHAIN", toolchain);
    }
    println!("xtask: building {} in {}", args.join(" "), dir.display());
    let status = command
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| format!("could not start cargo in {}: {e}", dir.display()))?;
    if !status.success() {
        return Err(format!(
            "building {} in {} failed ({status})",
            args.join(" "),
            dir.display()
        ));
    }
    let path = target
        .join(if profile == "dev" { "debug" } else { profile })
        .join(name);
    if path.exists() {
        Ok(path)
    } else {
        Err(format!("the build left no {}", path.display()))
    }
}

fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("git")
        .current_dir(dir)
        .args(args)
        .output()
        .map_err(|e| format!("could not run git: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A figure's values on each side, and its unit; keyed by (workload
/// order, figure).
type Figure = ([Vec<f64>; 2], String);

/// Runs `workloads` on `sides[0]` (the revision) and `sides[1]` (this
/// tree), `rounds` times interleaved; prints each figure's medians and the
/// ratio this tree / revision.
pub(crate) fn run(
    sides: &[Side; 2],
    envs: &[(String, String)],
    workloads: &[&str],
    rounds: usize,
    tiny: bool,
    timeout: Duration,
) -> Result<(), String> {
    let mut results: BTreeMap<(usize, String), Figure> = BTreeMap::new();
    let mut missing: [Vec<&str>; 2] = [Vec::new(), Vec::new()];
    let mut failed = Vec::new();
    for round in 0..rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for (w, workload) in workloads.iter().enumerate() {
            for side in order {
                if missing[side].contains(workload) || failed.contains(&(side, *workload)) {
                    continue;
                }
                let mut cmd = Command::new(&sides[side].bench);
                cmd.arg(workload).envs(envs.iter().map(|(k, v)| (k, v)));
                if let Some(rein) = &sides[side].rein {
                    cmd.env("REIN_BIN", rein);
                }
                if tiny {
                    cmd.arg("--tiny");
                }
                match run_bounded(cmd, timeout) {
                    Ok(stdout) => {
                        for (figure, value, unit) in parse_metrics(&stdout) {
                            results
                                .entry((w, figure))
                                .or_insert_with(|| (Default::default(), unit))
                                .0[side]
                                .push(value);
                        }
                    }
                    Err(e) if e.contains("unknown workload") => missing[side].push(workload),
                    Err(e) => {
                        eprintln!("xtask: {} on {}: {e}", workload, sides[side].label);
                        failed.push((side, *workload));
                    }
                }
            }
        }
    }
    println!(
        "{:<52} {:>14} {:>14} {:>9}  unit",
        "figure", sides[0].label, sides[1].label, "ratio"
    );
    for ((_, figure), (values, unit)) in results {
        let [old, new] = values.map(|v| (!v.is_empty()).then(|| median(v)));
        let show = |m: Option<f64>| m.map_or("missing".to_owned(), |m| format!("{m:.3}"));
        let ratio = match (old, new) {
            (Some(o), Some(n)) if o != 0.0 => format!("{:.3}", n / o),
            _ => "-".to_owned(),
        };
        println!(
            "{figure:<52} {:>14} {:>14} {ratio:>9}  {unit}",
            show(old),
            show(new)
        );
    }
    println!(
        "ratio = {} / {}, medians of {rounds} interleaved rounds (for runs/s and similar, above 1 is faster; for times, below 1 is)",
        sides[1].label, sides[0].label
    );
    for (side, list) in missing.iter().enumerate() {
        if !list.is_empty() {
            println!("missing in {}: {}", sides[side].label, list.join(", "));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        let names: Vec<String> = failed
            .iter()
            .map(|(side, w)| format!("{w} on {}", sides[*side].label))
            .collect();
        Err(format!("workloads failed: {}", names.join(", ")))
    }
}
