//! The gate and the in-memory ledger on a paused clock: windows, token
//! reservations corrected by usage, concurrency, FIFO order, cancels and
//! pauses.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::*;

fn gate(limits: ProviderLimits) -> Arc<ProviderGate> {
    ProviderGate::new("hosted", limits, Arc::new(InMemoryLedger::new()))
}

#[tokio::test(start_paused = true)]
async fn a_full_window_makes_the_next_inference_wait_until_a_reservation_expires() {
    let gate = gate(
        ProviderLimits::new()
            .requests_per_minute(2)
            .window(Duration::from_secs(60)),
    );
    let token = CancellationToken::new();
    let a = gate.admit(10, &token, |_| {}).await.unwrap();
    let b = gate.admit(10, &token, |_| {}).await.unwrap();
    a.settle(Some(5)).await;
    b.settle(Some(5)).await;
    let start = tokio::time::Instant::now();
    let mut waited = None;
    let c = gate.admit(10, &token, |d| waited = Some(d)).await.unwrap();
    let elapsed = start.elapsed();
    assert!(waited.is_some(), "the third inference reported a wait");
    assert!(elapsed >= Duration::from_secs(60), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(61), "{elapsed:?}");
    let usage = gate.status().await.usage.unwrap();
    // Both earlier reservations settled at once, so both expired.
    assert_eq!((usage.requests, usage.in_flight), (1, 1));
    drop(c);
}

#[tokio::test(start_paused = true)]
async fn tokens_are_reserved_and_corrected_by_the_reported_usage() {
    let gate = gate(ProviderLimits::new().tokens_per_minute(1000));
    let token = CancellationToken::new();
    let a = gate.admit(800, &token, |_| {}).await.unwrap();
    assert_eq!(gate.status().await.usage.unwrap().tokens, 800);
    a.settle(Some(300)).await;
    assert_eq!(gate.status().await.usage.unwrap().tokens, 300);
    // 300 + 700 fits without waiting.
    let mut waited = false;
    let _b = gate.admit(700, &token, |_| waited = true).await.unwrap();
    assert!(!waited);
}

#[tokio::test(start_paused = true)]
async fn a_prompt_larger_than_the_window_waits_for_an_empty_window_instead_of_forever() {
    let gate = gate(ProviderLimits::new().tokens_per_minute(100));
    let token = CancellationToken::new();
    let a = gate.admit(5000, &token, |_| {}).await.unwrap();
    assert_eq!(a.reserved(), 100);
}

#[tokio::test(start_paused = true)]
async fn max_concurrent_admits_the_next_when_one_settles() {
    let gate = gate(ProviderLimits::new().max_concurrent(1));
    let token = CancellationToken::new();
    let a = gate.admit(1, &token, |_| {}).await.unwrap();
    let second = {
        let gate = gate.clone();
        let token = token.clone();
        tokio::spawn(async move { gate.admit(1, &token, |_| {}).await.map(|p| p.reserved()) })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!second.is_finished());
    assert_eq!(gate.waiting(), 1);
    a.settle(Some(1)).await;
    assert_eq!(second.await.unwrap(), Ok(1));
}

#[tokio::test(start_paused = true)]
async fn waiters_are_admitted_in_the_order_they_began_waiting() {
    let gate = gate(
        ProviderLimits::new()
            .requests_per_minute(60)
            .window(Duration::from_secs(1)),
    );
    let token = CancellationToken::new();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..40 {
        let (gate, token, order) = (gate.clone(), token.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let permit = gate.admit(1, &token, |_| {}).await.unwrap();
            order.lock().unwrap().push(i);
            permit.settle(Some(1)).await;
        }));
        // Each begins waiting before the next does.
        tokio::task::yield_now().await;
    }
    for task in tasks {
        task.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order, (0..40).collect::<Vec<_>>());
}

#[tokio::test(start_paused = true)]
async fn a_cancel_during_the_wait_ends_it_at_once_and_gives_up_the_place() {
    let gate = gate(ProviderLimits::new().max_concurrent(1));
    let held = CancellationToken::new();
    let _a = gate.admit(1, &held, |_| {}).await.unwrap();
    let token = CancellationToken::new();
    let waiting = {
        let (gate, token) = (gate.clone(), token.clone());
        tokio::spawn(async move { gate.admit(1, &token, |_| {}).await.map(|p| p.reserved()) })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(gate.waiting(), 1);
    token.cancel();
    assert_eq!(waiting.await.unwrap(), Err(Refused::Cancelled));
    assert_eq!(gate.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_pause_holds_every_inference_until_it_ends() {
    let gate = gate(ProviderLimits::new().requests_per_minute(1000));
    gate.pause(Duration::from_secs(7)).await;
    assert_eq!(gate.status().await.usage.unwrap().paused_ms, Some(7000));
    let start = tokio::time::Instant::now();
    let _a = gate
        .admit(1, &CancellationToken::new(), |_| {})
        .await
        .unwrap();
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_secs(7) && elapsed < Duration::from_secs(8),
        "{elapsed:?}"
    );
}

#[test]
fn limits_are_checked_naming_the_key() {
    let error = ProviderLimits::new()
        .max_concurrent(0)
        .validate()
        .unwrap_err();
    assert!(error.starts_with("max_concurrent is 0"), "{error}");
    let error = ProviderLimits::new()
        .window(Duration::from_millis(5))
        .validate()
        .unwrap_err();
    assert!(error.starts_with("window_ms is 5"), "{error}");
    assert_eq!(
        ProviderLimits::new()
            .requests_per_minute(60)
            .window(Duration::from_secs(1))
            .requests_per_window(),
        Some(1)
    );
}
