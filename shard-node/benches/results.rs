//! Result-application benchmark of one shard store: how many worker results per second
//! `Store::apply_results` records, on SQLite and (with `RESULTS_BENCH_POSTGRES=1`) on a
//! PostgreSQL server started for it. Run it with
//! `cargo bench -p chronoshard-shard-node --bench results`.
//!
//! Set-up: `RESULTS_BENCH_TICKETS` one-shot jobs are created and fired (one multi-row fire batch
//! per 256) into one shard database, and every first attempt is marked published, as the shard
//! does before any worker reports. Then each ticket gets the two reports a no-op worker sends,
//! `started` and `succeeded`, applied in batches of `RESULTS_BENCH_BATCH` (the results
//! consumer's batch) in one of two orders:
//!
//! - `lagged`: ticket i's `started` comes with ticket i−`RESULTS_BENCH_LAG`'s `succeeded` (as
//!   with a worker running many tickets at once): a batch touches each attempt once.
//! - `paired`: a ticket's `started` is followed at once by its `succeeded` (a quick handler):
//!   most batches hold both reports of an attempt.
//!
//! Printed per order: results per second over all batches, and the p50 / p99 / max time of one
//! batch (the shard's writer lock is held that long, which firing waits for). Every run checks
//! that every run ended `succeeded`.
//!
//! Environment (defaults in brackets): `RESULTS_BENCH_TICKETS` [20000], `RESULTS_BENCH_BATCH`
//! [256], `RESULTS_BENCH_LAG` [128], `RESULTS_BENCH_POSTGRES` [0].

use std::time::{Duration, Instant};

use chronoshard_shard_node::{
    shard::store::{Acked, FireRequest, JobRow, Store},
    Databases,
};
use chronoshard_wire::{
    from_millis, JobSpec, JobState, Overlap, ResultKind, RunStatus, Ticket, TicketResult,
    PROTOCOL_VERSION,
};
use uuid::Uuid;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

// Only `env_num` is used here; the rest serves the other benches.
#[allow(dead_code)]
mod common;
use common::env_num;

fn main() -> Res<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run())
}

async fn run() -> Res<()> {
    let tickets = env_num("RESULTS_BENCH_TICKETS", 20_000)?;
    let batch = env_num("RESULTS_BENCH_BATCH", 256)?.max(1);
    let lag = env_num("RESULTS_BENCH_LAG", 128)?;
    let postgres = env_num("RESULTS_BENCH_POSTGRES", 0)? != 0;
    println!(
        "results bench: {tickets} tickets, batches of {batch}, load average {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let pg = if postgres {
        Some(chronoshard_test_util::Postgres::start().await?)
    } else {
        None
    };
    for order in [Order::Lagged(lag), Order::Paired] {
        let dir = tempfile::tempdir()?;
        let sqlite = Databases::Sqlite(dir.path().to_path_buf());
        measure("sqlite", &sqlite, tickets, batch, order).await?;
        if let Some(pg) = &pg {
            let dbs = Databases::Postgres(pg.create_database().await?);
            measure("postgres", &dbs, tickets, batch, order).await?;
        }
    }
    Ok(())
}

#[derive(Clone, Copy, Debug)]
enum Order {
    Lagged(usize),
    Paired,
}

async fn measure(backend: &str, dbs: &Databases, n: usize, batch: usize, order: Order) -> Res<()> {
    let store = Store::open(dbs, 0, 1, "bench-node", 0).await?;
    let fired = set_up(&store, n).await?;
    let reports = ordered(&fired, order);
    let mut times = Vec::new();
    let began = Instant::now();
    for (now, chunk) in (10_000..).zip(reports.chunks(batch)) {
        let t = Instant::now();
        store.apply_results(chunk, now).await?;
        times.push(t.elapsed());
    }
    let total = began.elapsed();
    times.sort();
    let pct = |p: f64| times[((times.len() - 1) as f64 * p) as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{backend:>8} {order:<12} {:>7.0} results/s ({} in {:.2} s); batch p50 {:.1} · p99 {:.1} · max {:.1} ms",
        reports.len() as f64 / total.as_secs_f64(),
        reports.len(),
        total.as_secs_f64(),
        ms(pct(0.5)),
        ms(pct(0.99)),
        ms(pct(1.0)),
        order = format!("{order:?}"),
    );
    for (job, _) in fired.iter().step_by((n / 50).max(1)) {
        let runs = store.runs(*job, None, 1).await?;
        if runs.first().map(|r| r.status) != Some(RunStatus::Succeeded) {
            return Err(format!("job {job}: run not succeeded: {runs:?}").into());
        }
    }
    store.close().await;
    Ok(())
}

/// Creates and fires `n` one-shot jobs; returns (job, ticket) pairs.
async fn set_up(store: &Store, n: usize) -> Res<Vec<(Uuid, Ticket)>> {
    let at = 1_000;
    let mut out = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(256) {
        let mut reqs = Vec::new();
        for k in chunk {
            let tenant = format!("t{}", k % 4);
            let spec: JobSpec = serde_json::from_value(serde_json::json!({
                "tenant": tenant, "name": "results-bench",
                "schedule": {"at": from_millis(at).to_rfc3339()},
                "target": {"type": "queue", "queue": "bench"},
            }))?;
            let job = JobRow {
                id: Uuid::now_v7(),
                tenant,
                spec,
                state: JobState::Active,
                created_at: 0,
                updated_at: 0,
                anchor_at: 0,
                next_fire_at: Some(at),
                buffered_at: None,
            };
            store.create_job(&job, None).await?;
            reqs.push(FireRequest {
                job_id: job.id,
                expected_next: Some(at),
                next_fire_at: None,
                not_fired: &[],
                occurrences: vec![(at, vec![ticket(&job, at)])],
                overlap: Overlap::Allow,
            });
        }
        let mut acked = Vec::new();
        for o in store.fire_batch(reqs, at).await? {
            for t in o.tickets {
                acked.push(Acked {
                    ticket: t.ticket_id,
                    attempt: 1,
                    seq: out.len() as u64 + 1,
                });
                out.push((t.job_id, t));
            }
        }
        store.mark_published(&acked, at + 1).await?;
    }
    Ok(out)
}

fn ordered(fired: &[(Uuid, Ticket)], order: Order) -> Vec<TicketResult> {
    let mut out = Vec::with_capacity(fired.len() * 2);
    match order {
        Order::Paired => {
            for (_, t) in fired {
                out.push(report(t, ResultKind::Started));
                out.push(report(t, ResultKind::Succeeded));
            }
        }
        Order::Lagged(lag) => {
            for i in 0..fired.len() + lag {
                if i < fired.len() {
                    out.push(report(&fired[i].1, ResultKind::Started));
                }
                if i >= lag {
                    out.push(report(&fired[i - lag].1, ResultKind::Succeeded));
                }
            }
        }
    }
    out
}

fn report(t: &Ticket, kind: ResultKind) -> TicketResult {
    TicketResult::about(t.ticket_id, 1, 0, kind, "bench-worker", from_millis(5_000))
}

fn ticket(job: &JobRow, at: i64) -> Ticket {
    let id = Uuid::now_v7();
    Ticket {
        v: PROTOCOL_VERSION,
        ticket_id: id,
        job_id: job.id,
        tenant: job.tenant.clone(),
        shard: 0,
        epoch: 1,
        scheduled_at: from_millis(at),
        attempt: 1,
        item: 0,
        items: 1,
        queue: "bench".into(),
        target: job.spec.target.clone(),
        payload: serde_json::Value::Null,
        timeout_ms: 30_000,
        priority: 5,
        trace_id: chronoshard_wire::trace_id_of(id),
        checkpoint: None,
    }
}
