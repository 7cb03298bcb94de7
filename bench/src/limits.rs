//! W14: provider limits. What admission costs an inference when the limits
//! are not reached: the gate alone (reserve and settle, in memory), W1's
//! rounds on a limited provider against the same rounds unlimited
//! (interleaved), and in PostgreSQL mode the admission's round trips
//! against a plain `SELECT 1`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rein::limits::{InMemoryLedger, LimitLedger, ProviderGate, ProviderLimits};
use rein::prelude::*;

use crate::{emit, fail, percentile, sorted};

/// Limits a benchmark never reaches, on a one-second window.
fn roomy() -> ProviderLimits {
    ProviderLimits::new()
        .requests_per_minute(1 << 40)
        .tokens_per_minute(1 << 50)
        .max_concurrent(1 << 20)
        .window(Duration::from_secs(1))
}

/// Reserve and settle `n` times on `gate`; the time per pair, in µs.
async fn admissions(gate: &Arc<ProviderGate>, n: usize) -> Vec<f64> {
    let token = CancellationToken::new();
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let permit = match gate.admit(1000, &token, |_| {}).await {
            Ok(permit) => permit,
            Err(e) => fail(&format!("limits: admission refused: {e:?}")),
        };
        permit.settle(Some(900)).await;
        times.push(start.elapsed().as_secs_f64() * 1e6);
    }
    times
}

/// In one process: the gate alone, then W1 limited against W1 plain.
pub(crate) async fn in_process(pairs: usize, runs: usize) {
    let ledger: Arc<dyn LimitLedger> = Arc::new(InMemoryLedger::new());
    let gate = ProviderGate::new("p", roomy(), ledger);
    let s = sorted(admissions(&gate, pairs).await);
    emit(
        "limits",
        "gate_admit_settle_median",
        percentile(&s, 0.5),
        "us",
    );
    emit(
        "limits",
        "gate_admit_settle_p99",
        percentile(&s, 0.99),
        "us",
    );

    const R: usize = 50;
    let plain = crate::runtime_with(crate::model(R, None), crate::spec());
    let limited = match AgentRuntimeBuilder::new()
        .with_agent_spec(crate::spec().with_model_id("m"))
        .with_model(ModelSpec::new("m", "p", "bench"))
        .with_provider("p", Arc::new(crate::model(R, None)))
        .with_provider_limits("p", roomy())
        .with_tool("noop", Arc::new(crate::Noop))
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => fail(&format!("limits: cannot build the runtime: {e}")),
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for i in 0..runs {
        for (runtime, out) in [(&plain, &mut a), (&limited, &mut b)] {
            let start = Instant::now();
            match runtime
                .run_to_completion(crate::user(format!("w14-{i}")))
                .await
            {
                Ok(r) if r.steps as usize == R + 1 => {}
                other => fail(&format!("limits: unexpected result {other:?}")),
            }
            out.push(start.elapsed().as_secs_f64() * 1e6 / R as f64);
        }
    }
    let (a, b) = (sorted(a), sorted(b));
    let (plain, limited) = (percentile(&a, 0.5), percentile(&b, 0.5));
    emit("limits", "per_round_unlimited_median", plain, "us");
    emit("limits", "per_round_limited_median", limited, "us");
    emit("limits", "admission_per_inference", limited - plain, "us");
}

/// In PostgreSQL mode: an admission (reserve) and its settle, each one
/// statement, against `SELECT 1` on the same pool.
pub(crate) async fn postgres(pairs: usize) {
    let db = crate::cluster::Database::create().await;
    let pool = match rein_postgres::connect(&db.url).await {
        Ok(pool) => pool,
        Err(e) => fail(&format!("cluster_limits: cannot connect: {e}")),
    };
    let ledger: Arc<dyn LimitLedger> = Arc::new(rein_postgres::PgLimitLedger::new(
        pool.clone(),
        "bench",
        Duration::from_secs(30),
    ));
    let gate = ProviderGate::new("p", roomy(), ledger);
    // Warm the pool and the plans.
    admissions(&gate, 20).await;
    let mut select = Vec::with_capacity(pairs);
    let mut admit = Vec::with_capacity(pairs);
    let token = CancellationToken::new();
    for _ in 0..pairs {
        let start = Instant::now();
        if let Err(e) = sqlx::query("SELECT 1").execute(&pool).await {
            fail(&format!("cluster_limits: {e}"));
        }
        select.push(start.elapsed().as_secs_f64() * 1e3);
        let start = Instant::now();
        let permit = match gate.admit(1000, &token, |_| {}).await {
            Ok(permit) => permit,
            Err(e) => fail(&format!("cluster_limits: admission refused: {e:?}")),
        };
        admit.push(start.elapsed().as_secs_f64() * 1e3);
        permit.settle(Some(900)).await;
    }
    pool.close().await;
    db.drop().await;
    let (select, admit) = (sorted(select), sorted(admit));
    emit(
        "cluster_limits",
        "select_1_median",
        percentile(&select, 0.5),
        "ms",
    );
    emit(
        "cluster_limits",
        "admit_median",
        percentile(&admit, 0.5),
        "ms",
    );
    emit(
        "cluster_limits",
        "admit_p99",
        percentile(&admit, 0.99),
        "ms",
    );
    emit(
        "cluster_limits",
        "admit_in_round_trips",
        percentile(&admit, 0.5) / percentile(&select, 0.5),
        "x",
    );
}
