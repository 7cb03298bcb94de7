//! Many tasks submitting to a few threads at once: no submission fails, no
//! two runs overlap on a thread, every message lands exactly once and in
//! each submitter's order, every tool call is answered, every handle resolves;
//! a reader of the threads meanwhile sees only valid histories, each read
//! the one before plus finished rounds.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use rein::prelude::*;
use serde_json::json;

const TASKS: usize = 32;
const SUBMISSIONS: usize = 50;
const THREADS: usize = 4;

/// Counts runs inside each thread (RunStart .. RunEnd) and records overlaps.
#[derive(Clone, Default)]
struct OverlapProbe {
    inside: Arc<Mutex<HashMap<String, usize>>>,
    overlaps: Arc<AtomicUsize>,
    runs: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl PhaseHook for OverlapProbe {
    async fn run(&self, ctx: &mut PhaseContext<'_>) -> Result<(), HookError> {
        let mut inside = self.inside.lock().unwrap();
        let n = inside.entry(ctx.thread_id().to_owned()).or_default();
        match ctx.phase() {
            Phase::RunStart => {
                *n += 1;
                self.runs.fetch_add(1, Ordering::SeqCst);
                if *n > 1 {
                    self.overlaps.fetch_add(1, Ordering::SeqCst);
                }
            }
            _ => *n -= 1,
        }
        Ok(())
    }
}

impl Plugin for OverlapProbe {
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), StateError> {
        r.register_hook(Phase::RunStart, Arc::new(self.clone()));
        r.register_hook(Phase::RunEnd, Arc::new(self.clone()));
        Ok(())
    }
}

/// A tiny deterministic generator for the delays.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

async fn jitter(seed: &mut u64) {
    match next(seed) % 8 {
        0 => tokio::time::sleep(Duration::from_millis(1)).await,
        n => {
            for _ in 0..n {
                tokio::task::yield_now().await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submissions_keep_every_invariant() {
    // The model calls a tool after a user message and answers after a tool result.
    let model = ScriptedExecutor::from_fn(|req| match req.messages.last().map(|m| m.role) {
        Some(Role::User) => ScriptedResponse::tool_call("sleep", json!({"ms": 1})),
        _ => ScriptedResponse::text("ack"),
    });
    let probe = OverlapProbe::default();
    let runtime = builder_with(model, spec().with_plugin_id("probe"))
        .with_plugin("probe", Arc::new(probe.clone()))
        .with_tool("sleep", Arc::new(Sleeper::new(false)))
        .build()
        .unwrap();

    let mut submitters = Vec::new();
    for task in 0..TASKS {
        let mailbox = runtime.mailbox();
        submitters.push(tokio::spawn(async move {
            let mut seed = 0x9E37_79B9_7F4A_7C15 ^ (task as u64 + 1);
            let mut handles = Vec::new();
            for k in 0..SUBMISSIONS {
                jitter(&mut seed).await;
                let thread = format!("thread-{}", task % THREADS);
                let handle = mailbox
                    .submit(user(&thread, &format!("s{task}-{k}")))
                    .await
                    .unwrap_or_else(|e| panic!("submission s{task}-{k} failed: {e}"));
                handles.push(handle);
            }
            handles
        }));
    }
    // Reads every thread while the runs go on: each read is a valid
    // history (no round in progress) and extends the previous read.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = tokio::spawn({
        let runtime = runtime.clone();
        let done = done.clone();
        async move {
            let mut last: Vec<Vec<Message>> = vec![Vec::new(); THREADS];
            let mut reads = 0usize;
            while !done.load(Ordering::SeqCst) {
                for (t, last) in last.iter_mut().enumerate() {
                    let now = runtime.thread_messages(&format!("thread-{t}")).await;
                    assert_history_valid(&now);
                    assert!(
                        now.len() >= last.len() && now[..last.len()] == last[..],
                        "thread-{t} read {reads}: a read does not extend the previous one"
                    );
                    *last = now;
                    reads += 1;
                }
                tokio::task::yield_now().await;
            }
            reads
        }
    });
    let mut resolved = 0;
    for submitter in submitters {
        for handle in submitter.await.unwrap() {
            handle.wait().await.unwrap();
            resolved += 1;
        }
    }
    assert_eq!(resolved, TASKS * SUBMISSIONS);
    done.store(true, Ordering::SeqCst);
    let reads = reader.await.unwrap();
    assert!(reads > THREADS, "the reader read only {reads} times");
    assert_eq!(
        probe.overlaps.load(Ordering::SeqCst),
        0,
        "two runs overlapped on a thread"
    );
    assert_eq!(probe.runs.load(Ordering::SeqCst), TASKS * SUBMISSIONS);

    for t in 0..THREADS {
        let thread = format!("thread-{t}");
        assert!(!runtime.is_thread_active(&thread));
        let history = runtime.thread_messages(&thread).await;
        assert_history_valid(&history);
        let users: Vec<&str> = history
            .iter()
            .filter(|m| m.role == Role::User)
            .map(|m| m.content.as_str())
            .collect();
        assert_eq!(
            users.len(),
            (TASKS / THREADS) * SUBMISSIONS,
            "{thread} lost or duplicated input"
        );
        for task in (t..TASKS).step_by(THREADS) {
            let mine: Vec<usize> = users
                .iter()
                .filter_map(|u| u.strip_prefix(&format!("s{task}-")))
                .map(|k| k.parse().unwrap())
                .collect();
            assert_eq!(
                mine,
                (0..SUBMISSIONS).collect::<Vec<_>>(),
                "submitter {task} on {thread}"
            );
        }
    }
}
