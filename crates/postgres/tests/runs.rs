//! The shared runs (the inbox's group commit) and the fenced store's kept
//! histories, against a real PostgreSQL (`REIN_DATABASE_URL`; without it
//! the tests say they are skipped).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::HashSet;
use std::time::Duration;

use rein::prelude::*;
use rein_postgres::{Leases, NewRun, PgRuns, PgThreadStore, SubmitOutcome, ThreadStore};
use serde_json::json;

mod common;
use common::{thread, url};

async fn runs(url: &str, owner: &str) -> PgRuns {
    let pool = rein_postgres::connect(url).await.unwrap();
    let leases = Leases::new(pool.clone(), owner, Duration::from_secs(30));
    PgRuns::new(pool, leases)
}

/// Submits `(run id, key)`s all at once (they are committed in batches).
async fn submit_together(
    runs: &PgRuns,
    thread_id: &str,
    submissions: &[(String, Option<String>)],
) -> Vec<SubmitOutcome> {
    let messages = json!([{"role": "user", "content": "go"}]);
    let pending = submissions.iter().map(|(run_id, key)| {
        let new = NewRun {
            run_id,
            thread_id,
            agent_id: "a",
            interrupt: false,
            reject_if_busy: false,
            idempotency_key: key.as_deref(),
            messages: &messages,
            message_ids: &[],
            auto: None,
        };
        let runs = runs.clone();
        async move { runs.submit(&new).await.unwrap() }
    });
    futures::future::join_all(pending).await
}

/// Finishes the thread's queued runs, so it leaves no work behind for the
/// scans of later tests or runs.
async fn finish_queued(runs: &PgRuns, thread_id: &str) {
    for run_id in runs.queued(thread_id).await.unwrap() {
        runs.finish_queued(&run_id, &json!({}), &[]).await.unwrap();
    }
}

/// Scans (as `runs`' owner) until `thread_id` is answered, or until the
/// scans went round every orphaned thread without it (they answered a
/// thread a second time); whether it was answered.
async fn answered_within_a_round(runs: &PgRuns, thread_id: &str) -> bool {
    let mut seen = HashSet::new();
    for _ in 0..10_000 {
        let threads = runs.orphaned().await.unwrap();
        if threads.iter().any(|t| t == thread_id) {
            return true;
        }
        let mut round = threads.is_empty();
        for t in threads {
            round |= !seen.insert(t);
        }
        if round {
            return false;
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submissions_made_together_with_one_key_make_one_run() {
    let Some(url) = url() else { return };
    let runs = runs(&url, "inbox-keys").await;
    let t = thread("keys");
    let submissions: Vec<(String, Option<String>)> = (0..40)
        .map(|i| (format!("{t}-run-{i}"), Some("same".to_owned())))
        .collect();
    let outcomes = submit_together(&runs, &t, &submissions).await;
    let queued: Vec<usize> = (0..outcomes.len())
        .filter(|i| outcomes[*i] == SubmitOutcome::Queued)
        .collect();
    assert_eq!(queued.len(), 1, "{outcomes:?}");
    let first = submissions[queued[0]].0.clone();
    for outcome in &outcomes {
        assert!(
            *outcome == SubmitOutcome::Queued
                || *outcome == SubmitOutcome::Duplicate(first.clone()),
            "{outcomes:?}"
        );
    }
    assert_eq!(runs.queued(&t).await.unwrap(), vec![first]);
    finish_queued(&runs, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_run_id_is_refused_without_failing_the_submissions_beside_it() {
    let Some(url) = url() else { return };
    let runs = runs(&url, "inbox-taken").await;
    let t = thread("taken");
    let taken = format!("{t}-taken");
    assert_eq!(
        submit_together(&runs, &t, &[(taken.clone(), None)]).await,
        vec![SubmitOutcome::Queued]
    );
    let mut submissions: Vec<(String, Option<String>)> =
        (0..20).map(|i| (format!("{t}-run-{i}"), None)).collect();
    submissions.insert(10, (taken.clone(), None));
    let outcomes = submit_together(&runs, &t, &submissions).await;
    for ((run_id, _), outcome) in submissions.iter().zip(&outcomes) {
        let expected = if *run_id == taken {
            SubmitOutcome::RunIdTaken
        } else {
            SubmitOutcome::Queued
        };
        assert_eq!(*outcome, expected, "{run_id}");
    }
    assert_eq!(runs.queued(&t).await.unwrap().len(), 21);
    finish_queued(&runs, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_s_submissions_from_one_process_are_queued_in_the_order_they_came() {
    let Some(url) = url() else { return };
    let runs = runs(&url, "inbox-order").await;
    let t = thread("order");
    let mut expected = Vec::new();
    for i in 0..30 {
        let run_id = format!("{t}-run-{i:02}");
        submit_together(&runs, &t, &[(run_id.clone(), None)]).await;
        expected.push(run_id);
    }
    assert_eq!(runs.queued(&t).await.unwrap(), expected);
    finish_queued(&runs, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_history_is_not_served_once_another_process_took_the_thread() {
    let Some(url) = url() else { return };
    let pool = rein_postgres::connect(&url).await.unwrap();
    let a = Leases::new(pool.clone(), "keep-a", Duration::from_millis(400));
    let b = Leases::new(pool.clone(), "keep-b", Duration::from_secs(30));
    let (store_a, store_b) = (
        PgThreadStore::fenced(pool.clone(), a.clone()),
        PgThreadStore::fenced(pool.clone(), b.clone()),
    );
    let t = thread("keep");
    a.acquire(&t).await.unwrap().expect("a free thread");
    store_a.append(&t, &[Message::user("one")]).await.unwrap();
    assert_eq!(store_a.load(&t).await.unwrap(), vec![Message::user("one")]);
    store_a.append(&t, &[Message::user("two")]).await.unwrap();
    // a stops renewing; b takes the thread and writes.
    tokio::time::sleep(Duration::from_millis(700)).await;
    b.acquire(&t).await.unwrap().expect("an expired lease");
    store_b.append(&t, &[Message::user("three")]).await.unwrap();
    b.release(&t).await.unwrap();
    // a takes it back at a new fence: what it kept is stale, not served.
    a.acquire(&t).await.unwrap().expect("a released lease");
    let all = vec![
        Message::user("one"),
        Message::user("two"),
        Message::user("three"),
    ];
    assert_eq!(store_a.load(&t).await.unwrap(), all);
    store_a.replace(&t, &[Message::user("only")]).await.unwrap();
    assert_eq!(store_a.load(&t).await.unwrap(), vec![Message::user("only")]);
    assert_eq!(
        PgThreadStore::new(pool).load(&t).await.unwrap(),
        vec![Message::user("only")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_run_is_left_to_its_submitter_for_the_grace_then_counts_as_orphaned() {
    let Some(url) = url() else { return };
    // Its own owner: its scans go round the orphaned threads on their own,
    // whatever other tests (or earlier runs) left there.
    let runs = runs(&url, &thread("inbox-grace")).await;
    let t = thread("grace");
    submit_together(&runs, &t, &[(format!("{t}-run"), None)]).await;
    let at_once = answered_within_a_round(&runs, &t).await;
    tokio::time::sleep(rein_postgres::ORPHAN_GRACE + Duration::from_millis(200)).await;
    let after_the_grace = answered_within_a_round(&runs, &t).await;
    finish_queued(&runs, &t).await;
    assert!(!at_once, "a thread was taken from its submitter at once");
    assert!(
        after_the_grace,
        "a thread with an unowned run older than the grace is not orphaned"
    );
    assert!(
        !answered_within_a_round(&runs, &t).await,
        "a thread whose runs all finished is orphaned"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_one_of_more_orphaned_threads_than_a_scan_answers_is_answered_within_a_round() {
    let Some(url) = url() else { return };
    const THREADS: usize = 300;
    let runs = runs(&url, &thread("fair-scans")).await;
    // 300 threads (more than the 256 a scan answers), each with a run
    // whose submitter is gone.
    let name = thread("fair");
    let mine: Vec<String> = (0..THREADS).map(|i| format!("{name}-{i:03}")).collect();
    let submitter = &runs;
    futures::future::join_all(mine.iter().map(|t| async move {
        submit_together(submitter, t, &[(format!("{t}-run"), None)]).await
    }))
    .await;
    tokio::time::sleep(rein_postgres::ORPHAN_GRACE + Duration::from_millis(200)).await;
    let mine_set: HashSet<&str> = mine.iter().map(String::as_str).collect();

    // Scans, counting until each of them has been answered once;
    // `others` are the orphaned threads other tests or runs left.
    // Without taking any (a scanner that cannot take what it finds, the
    // worst case): a scan that started at the first thread id every time
    // would answer the same 256 for ever.
    let mut answered = HashSet::new();
    let mut others = HashSet::new();
    let mut scans_untaken = 0;
    while answered.len() < THREADS && scans_untaken < 1_000 {
        scans_untaken += 1;
        for t in runs.orphaned().await.unwrap() {
            if mine_set.contains(t.as_str()) {
                answered.insert(t);
            } else {
                others.insert(t);
            }
        }
    }
    let (untaken_all, untaken_others) = (answered.len(), others.len());
    let untaken_bound = (THREADS + untaken_others).div_ceil(256) + 1;

    // As the service does: each thread is taken (its lease) once answered;
    // then it is not answered again.
    let mut answered = HashSet::new();
    let mut others = HashSet::new();
    let mut scans_taken = 0;
    let mut taken_again = Vec::new();
    while answered.len() < THREADS && scans_taken < 1_000 {
        scans_taken += 1;
        for t in runs.orphaned().await.unwrap() {
            if mine_set.contains(t.as_str()) {
                runs.leases()
                    .acquire(&t)
                    .await
                    .unwrap()
                    .expect("an orphaned thread");
                if !answered.insert(t.clone()) {
                    taken_again.push(t);
                }
            } else {
                others.insert(t);
            }
        }
    }
    let taken_all = answered.len();
    let taken_bound = (THREADS + others.len()).div_ceil(256) + 1;

    for t in &mine {
        finish_queued(&runs, t).await;
        runs.leases().release(t).await.unwrap();
    }
    assert_eq!(
        untaken_all, THREADS,
        "not answered in {scans_untaken} scans"
    );
    assert!(
        scans_untaken <= untaken_bound,
        "{scans_untaken} scans to answer all {THREADS} (with {untaken_others} others), more than {untaken_bound}"
    );
    assert_eq!(taken_all, THREADS, "not answered in {scans_taken} scans");
    assert!(
        taken_again.is_empty(),
        "answered once taken: {taken_again:?}"
    );
    assert!(
        scans_taken <= taken_bound,
        "{scans_taken} scans to answer and take all {THREADS}, more than {taken_bound}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_answer_was_lost_is_found_again_until_it_starts() {
    let Some(url) = url() else { return };
    let mine = runs(&url, "claim-lost").await;
    let t = thread("claim-lost");
    mine.leases()
        .acquire(&t)
        .await
        .unwrap()
        .expect("a free thread");
    let ids = [format!("{t}-run-1"), format!("{t}-run-2")];
    submit_together(&mine, &t, &[(ids[0].clone(), None), (ids[1].clone(), None)]).await;
    assert!(mine.claimed_here(&t).await.unwrap().is_empty());
    // The claim commits; its answer is dropped, as a lost reply would be.
    let claimed = mine.claim(&t, false).await.unwrap().unwrap();
    assert_eq!(claimed.run_id, ids[0]);
    drop(claimed);
    let found = mine.claimed_here(&t).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].run_id, ids[0]);
    assert_eq!(
        found[0].messages,
        json!([{"role": "user", "content": "go"}])
    );
    // Once it has started (its first event is stored), it is not found.
    let event = rein_postgres::StoredEvent {
        seq: 1,
        kind: "run_started".to_owned(),
        data: "{}".to_owned(),
    };
    assert!(mine.append_events(&t, &ids[0], &[event]).await.unwrap());
    assert!(mine.claimed_here(&t).await.unwrap().is_empty());
    // Another owner's claims are not this process's.
    let other = runs(&url, "claim-other").await;
    assert!(other.claimed_here(&t).await.unwrap().is_empty());
    // Nothing is left open.
    assert!(mine.finish(&t, &ids[0], &json!({}), &[]).await.unwrap());
    finish_queued(&mine, &t).await;
    mine.leases().release(&t).await.unwrap();
}
