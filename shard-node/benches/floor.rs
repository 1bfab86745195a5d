//! An approximate floor of one job's database writes: what SQLite, reached through sqlx, spends
//! to write the rows a one-shot job's fire, publish ack and result write in a shard database,
//! with little else around it. Run it with `cargo bench -p chronoshard-shard-node --bench floor`.
//!
//! A shard database is made by `Store::open` (the real schema and its indexes, WAL,
//! `synchronous = NORMAL`), filled with `FLOOR_BENCH_JOBS` one-shot jobs due at one instant
//! (UUIDv7 ids, as the platform's, and a spec and ticket body of the platform's size). Then, in
//! batches of `FLOOR_BENCH_BATCH` jobs (the shard's fire batch), each as one transaction that
//! first checks the epoch as the store does, the same rows the store writes for a job:
//!
//! 1. fire: the job moved on (`completed`), a run, a ticket with its body, a first attempt;
//! 2. ack: the attempt marked published, with its stream sequence;
//! 3. result: the attempt, the ticket and the run marked `succeeded`.
//!
//! Each statement is set-based SQL prepared once (the job and ticket ids come from a table of
//! the bench's own; only the batch's range is bound): no row crosses into Rust, no statement is
//! built or parsed for a batch, no JSON is read. So this is about a floor, not a figure of the
//! store: what an implementation of the present schema on sqlx pays at that batch size (the
//! bench's own id and body lookups add a little that the store does not do). The
//! process's CPU time (user + system, all threads: the SQLite connection runs on a thread of its
//! own) per job is printed for each step and in all, with the wall time; the bench checks that
//! every run ended `succeeded`.
//!
//! Each statement is a trip to the connection's thread and back, as sqlx runs SQLite. At the
//! shard's batch of 128 that is a few percent of the figure; at a batch of one, most of it: a
//! `perf` profile at `FLOOR_BENCH_BATCH=1` had 60% of the samples in the kernel's task switch
//! (`finish_task_switch`, `_raw_spin_unlock_irqrestore`) on the VM of BENCHMARKS.md. So small
//! batches measure the hand-offs as much as SQLite; both are what a small transaction costs.
//!
//! `FLOOR_BENCH_DRIVER=rusqlite` runs the same statements through rusqlite on a thread of the
//! bench's own instead, the batch handed over once and answered once (what a shard owning its
//! SQLite connection on a thread would do): the difference between the two drivers is what the
//! hand-offs per statement cost, since the SQL, the schema and the SQLite library are the same.
//!
//! Environment (defaults in brackets): `FLOOR_BENCH_JOBS` [30000], `FLOOR_BENCH_BATCH` [128],
//! `FLOOR_BENCH_DRIVER` [sqlx].
//! The WAL is checkpointed by SQLite's own threshold here (the shard node checkpoints from a
//! connection of its own), so checkpoints count in the figures as they do in a node's CPU.

use std::time::Instant;

use chronoshard_shard_node::{shard::store::Store, Databases};
use sqlx::{sqlite::SqlitePoolOptions, Executor, SqlitePool};
use uuid::Uuid;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

// Only `env_num`, `loadavg` and `runtime` are used here; the rest serves the other benches.
#[allow(dead_code)]
mod common;
use common::{env_num, loadavg};

/// A job spec and a ticket body of the sizes the load test's jobs have (about 250 and 500 bytes).
const SPEC: &str = r#"{"tenant":"lt-0a1b2c3d-7","name":"lt-0a1b2c3d-123","schedule":{"at":"2026-12-02T05:00:00Z"},"target":{"type":"queue","queue":"lt-0a1b2c3d"},"payload":{"loadtest":"0a1b2c3d"},"retry":{"max_attempts":5,"backoff":"fixed","initial":"1s"},"overlap":"allow","catchup":{"policy":"all"}}"#;

fn body() -> String {
    let mut b = String::from(r#"{"v":1,"ticket_id":"0193a3c4-0000-7000-8000-000000000000","#);
    while b.len() < 500 {
        b.push_str(r#""pad":"x","#);
    }
    b.push('}');
    b
}

fn main() -> Res<()> {
    common::runtime()?.block_on(run())
}

async fn run() -> Res<()> {
    let jobs = env_num("FLOOR_BENCH_JOBS", 30_000)?.max(1);
    let batch = env_num("FLOOR_BENCH_BATCH", 128)?.max(1);
    let dir = tempfile::tempdir()?;
    Store::open(
        &Databases::Sqlite(dir.path().to_path_buf()),
        0,
        1,
        "floor",
        0,
    )
    .await?;
    let url = format!("sqlite://{}", dir.path().join("shard-0.db").display());
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .after_connect(|c, _| {
            Box::pin(async move {
                c.execute("PRAGMA synchronous = NORMAL").await?;
                Ok(())
            })
        })
        .connect(&url)
        .await?;
    set_up(&pool, jobs).await?;
    println!(
        "floor bench: {jobs} one-shot jobs, batches of {batch}, load average {}",
        loadavg()
    );
    let batches: Vec<(usize, usize)> = (0..jobs)
        .step_by(batch)
        .map(|lo| (lo, (lo + batch).min(jobs)))
        .collect();
    if std::env::var("FLOOR_BENCH_DRIVER").as_deref() == Ok("rusqlite") {
        pool.close().await;
        return owned_thread::run(&dir.path().join("shard-0.db"), &batches, jobs).await;
    }
    println!("  driver  sqlx (one hand-off per statement)");
    let mut total = 0.0;
    let mut conn = pool.acquire().await?;
    for (step, statements) in STEPS {
        let (cpu0, wall) = (cpu_seconds()?, Instant::now());
        for (lo, hi) in &batches {
            // As the store opens a write transaction: the write lock, then the epoch check
            // (which writes nothing while the epoch is the owner's).
            conn.execute("BEGIN IMMEDIATE").await?;
            conn.execute(EPOCH_CHECK).await?;
            for sql in statements {
                sqlx::query(sql)
                    .bind(*lo as i64)
                    .bind(*hi as i64)
                    .execute(&mut *conn)
                    .await?;
            }
            conn.execute("COMMIT").await?;
        }
        total += report(step, cpu0, wall, jobs)?;
    }
    println!("  all     {:6.1} µs CPU per job", total * 1e6 / jobs as f64);
    let done: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM runs WHERE status = 'succeeded'")
        .fetch_one(&mut *conn)
        .await?;
    check_done(done, jobs)
}

/// Prints one step's CPU per job and returns its CPU seconds.
fn report(step: &str, cpu0: f64, wall: Instant, jobs: usize) -> Res<f64> {
    let cpu = cpu_seconds()? - cpu0;
    println!(
        "  {step:<7} {:6.1} µs CPU per job ({:.2} s CPU, {:.2} s wall)",
        cpu * 1e6 / jobs as f64,
        cpu,
        wall.elapsed().as_secs_f64()
    );
    Ok(cpu)
}

fn check_done(done: i64, jobs: usize) -> Res<()> {
    if done != jobs as i64 {
        return Err(format!("{done} of {jobs} runs succeeded").into());
    }
    Ok(())
}

/// The batches through rusqlite on a thread that owns the connection: one hand-off there and one
/// answer back per batch.
mod owned_thread {
    use std::{path::Path, sync::mpsc, time::Instant};

    use super::{check_done, cpu_seconds, report, Res, EPOCH_CHECK, STEPS};

    type Batch = (usize, usize, usize, tokio::sync::oneshot::Sender<Res<()>>);

    pub async fn run(path: &Path, batches: &[(usize, usize)], jobs: usize) -> Res<()> {
        println!("  driver  rusqlite on an owned thread (one hand-off per batch)");
        let conn = rusqlite::Connection::open(path)?;
        conn.execute_batch("PRAGMA synchronous = NORMAL")?;
        let (tx, rx) = mpsc::channel::<Batch>();
        let thread = std::thread::spawn(move || serve(&conn, rx).map(|()| conn));
        let mut total = 0.0;
        for (i, (step, _)) in STEPS.iter().enumerate() {
            let (cpu0, wall) = (cpu_seconds()?, Instant::now());
            for (lo, hi) in batches {
                let (done, answer) = tokio::sync::oneshot::channel();
                tx.send((i, *lo, *hi, done))?;
                answer.await??;
            }
            total += report(step, cpu0, wall, jobs)?;
        }
        println!("  all     {:6.1} µs CPU per job", total * 1e6 / jobs as f64);
        drop(tx);
        let conn = thread.join().map_err(|_| "the SQLite thread panicked")??;
        let done: i64 = conn.query_row(
            "SELECT COUNT(*) FROM runs WHERE status = 'succeeded'",
            [],
            |r| r.get(0),
        )?;
        check_done(done, jobs)
    }

    /// Runs each batch it is handed as one transaction, as the store does.
    fn serve(conn: &rusqlite::Connection, batches: mpsc::Receiver<Batch>) -> Res<()> {
        for (step, lo, hi, done) in batches {
            let run = || -> Res<()> {
                conn.execute_batch("BEGIN IMMEDIATE")?;
                conn.prepare_cached(EPOCH_CHECK)?.execute([])?;
                for sql in STEPS[step].1 {
                    conn.prepare_cached(sql)?.execute([lo as i64, hi as i64])?;
                }
                conn.execute_batch("COMMIT")?;
                Ok(())
            };
            let _ = done.send(run());
        }
        Ok(())
    }
}

/// The jobs, due at one instant, and the ids the batches take.
async fn set_up(pool: &SqlitePool, jobs: usize) -> Res<()> {
    pool.execute(
        "CREATE TABLE bench_ids (n INTEGER PRIMARY KEY, job TEXT NOT NULL, ticket TEXT NOT NULL)",
    )
    .await?;
    let mut tx = pool.begin().await?;
    for chunk in (0..jobs).collect::<Vec<_>>().chunks(500) {
        let values: Vec<String> = chunk
            .iter()
            .map(|n| format!("({n}, '{}', '{}')", Uuid::now_v7(), Uuid::now_v7()))
            .collect();
        tx.execute(format!("INSERT INTO bench_ids VALUES {}", values.join(", ")).as_str())
            .await?;
    }
    tx.execute(
        sqlx::query(
            "INSERT INTO jobs (id, tenant, spec, state, created_at, updated_at, anchor_at, next_fire_at) \
             SELECT job, 'lt-0a1b2c3d-7', ?, 'active', 1, 1, 1, 1000 FROM bench_ids",
        )
        .bind(SPEC),
    )
    .await?;
    tx.commit().await?;
    // The body goes into every ticket row: kept in a table once instead of in each statement.
    pool.execute(sqlx::query("CREATE TABLE bench_body AS SELECT ? AS body").bind(body()))
        .await?;
    pool.execute("PRAGMA wal_checkpoint(TRUNCATE)").await?;
    Ok(())
}

// The ids of a batch: `n >= ?1 AND n < ?2`. `+next_fire_at`: every job is due at the same
// instant, so without the `+` SQLite would look the jobs up through `jobs_due` (one key for all
// of them) instead of by id; the store's own statement joins on the id.
const FIRE: &[&str] = &[
    "UPDATE jobs SET next_fire_at = NULL, state = 'completed', updated_at = 2 \
     WHERE id IN (SELECT job FROM bench_ids WHERE n >= ?1 AND n < ?2) \
     AND +next_fire_at = 1000 AND state = 'active'",
    "INSERT INTO runs (job_id, scheduled_at, status, attempts, created_at, updated_at) \
     SELECT job, 1000, 'dispatched', 1, 2, 2 FROM bench_ids WHERE n >= ?1 AND n < ?2",
    "INSERT INTO tickets (id, job_id, scheduled_at, item, status, attempt, epoch, queue, body, \
     timeout_ms, created_at, updated_at) \
     SELECT ticket, job, 1000, 0, 'dispatched', 1, 1, 'lt-0a1b2c3d', \
     (SELECT body FROM bench_body), 30000, 2, 2 FROM bench_ids WHERE n >= ?1 AND n < ?2",
    "INSERT INTO attempts (ticket_id, attempt, status, created_at, not_before) \
     SELECT ticket, 1, 'dispatched', 2, NULL FROM bench_ids WHERE n >= ?1 AND n < ?2",
];

/// As the store opens a write transaction: writes nothing while the epoch is the owner's.
const EPOCH_CHECK: &str =
    "UPDATE OR ROLLBACK shard_meta SET epoch = NULL WHERE id = 1 AND epoch IS NOT 1";

const STEPS: [(&str, &[&str]); 3] = [("fire", FIRE), ("ack", ACK), ("result", RESULT)];

const ACK: &[&str] = &["UPDATE attempts SET published_at = 3, publish_seq = 7 \
     WHERE attempt = 1 AND ticket_id IN (SELECT ticket FROM bench_ids WHERE n >= ?1 AND n < ?2)"];

const RESULT: &[&str] = &[
    "UPDATE attempts SET status = 'succeeded', started_at = 4, finished_at = 5, worker = 'w1' \
     WHERE attempt = 1 AND ticket_id IN (SELECT ticket FROM bench_ids WHERE n >= ?1 AND n < ?2)",
    "UPDATE tickets SET status = 'succeeded', updated_at = 5 \
     WHERE id IN (SELECT ticket FROM bench_ids WHERE n >= ?1 AND n < ?2)",
    "UPDATE runs SET status = 'succeeded', updated_at = 5 \
     WHERE scheduled_at = 1000 AND job_id IN (SELECT job FROM bench_ids WHERE n >= ?1 AND n < ?2)",
];

/// User + system CPU seconds of this process so far (all threads).
fn cpu_seconds() -> Res<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let rest = &stat[stat.rfind(')').ok_or("odd /proc/self/stat")? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = f[11].parse::<u64>()? + f[12].parse::<u64>()?;
    Ok(ticks as f64 / 100.0)
}
