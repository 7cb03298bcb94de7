//! The shared runs (the inbox's group commit) and the fenced store's kept
//! histories, against a real PostgreSQL (`REIN_DATABASE_URL`; without it
//! the tests say they are skipped).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

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
        };
        let runs = runs.clone();
        async move { runs.submit(&new).await.unwrap() }
    });
    futures::future::join_all(pending).await
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
    let runs = runs(&url, "inbox-grace").await;
    // `orphaned` answers at most 256 threads in id order: a leading `0`
    // puts this one before the letter-named threads other tests leave.
    let t = thread("0-grace");
    submit_together(&runs, &t, &[(format!("{t}-run"), None)]).await;
    assert!(
        !runs.orphaned().await.unwrap().contains(&t),
        "a thread was taken from its submitter at once"
    );
    tokio::time::sleep(rein_postgres::ORPHAN_GRACE + Duration::from_millis(200)).await;
    assert!(
        runs.orphaned().await.unwrap().contains(&t),
        "a thread with an unowned run older than the grace is not orphaned"
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
}
