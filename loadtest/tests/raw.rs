//! The raw JetStream round trip against a nats-server of its own: every ticket comes back once,
//! the percentiles are sane, the run's streams are gone afterwards, and an unreachable NATS is an
//! error within the timeout rather than a hang.

use std::time::{Duration, Instant};

use async_nats::jetstream::{context::GetStreamErrorKind, ErrorCode};
use chronoshard_loadtest::raw::{self, RawError, RawOptions};
use chronoshard_test_util::Nats;

fn options(nats_url: String, run_id: &str, count: u64, rate_per_s: f64) -> RawOptions {
    RawOptions {
        nats_url,
        run_id: run_id.into(),
        count,
        rate_per_s,
        window: 1024,
        timeout: Duration::from_secs(30),
    }
}

async fn run_and_check(nats: &Nats, opts: RawOptions) -> anyhow::Result<()> {
    let stats = raw::run(&opts).await?;
    assert_eq!(stats.count, opts.count);
    assert_eq!(stats.target_per_s, opts.rate_per_s);
    let p = stats.round_trip_ms;
    // One sample per sequence number (the run itself fails on a missing or doubled one).
    assert_eq!(p.count, opts.count, "{p:?}");
    assert!(p.min > 0.0, "{p:?}");
    assert!(p.min <= p.p50 && p.p50 <= p.p99 && p.p99 <= p.max, "{p:?}");
    assert!(stats.per_s > 0.0, "{stats:?}");

    let js = async_nats::jetstream::new(nats.client().await?);
    for name in [
        raw::work_stream(&opts.run_id),
        raw::done_stream(&opts.run_id),
    ] {
        let err = js
            .get_stream(&name)
            .await
            .expect_err("stream deleted after the run");
        assert!(
            matches!(err.kind(), GetStreamErrorKind::JetStream(e)
                if e.error_code() == ErrorCode::STREAM_NOT_FOUND),
            "{name}: {err}"
        );
    }
    println!("{:?}: {stats:?}", opts.rate_per_s);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_fast_as_possible_every_ticket_comes_back_once() -> anyhow::Result<()> {
    let nats = Nats::start().await?;
    run_and_check(&nats, options(nats.url(), "fast", 2_000, 0.0)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_at_500_per_s() -> anyhow::Result<()> {
    let nats = Nats::start().await?;
    let opts = options(nats.url(), "paced-1", 1_000, 500.0);
    run_and_check(&nats, opts.clone()).await?;
    // Open loop: the tickets go out on schedule, so the run takes about count / rate.
    let again = raw::run(&RawOptions {
        run_id: "paced-2".into(),
        ..opts
    })
    .await?;
    assert!((400.0..600.0).contains(&again.per_s), "{again:?}");
    Ok(())
}

#[tokio::test]
async fn unreachable_nats_is_an_error_not_a_hang() -> anyhow::Result<()> {
    // A port nobody listens on (refused at once) and one that accepts but never speaks NATS.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let timeout = Duration::from_secs(2);
    for addr in [closed, silent.local_addr()?] {
        let opts = RawOptions {
            timeout,
            ..options(format!("nats://{addr}"), "unreachable", 10, 0.0)
        };
        let started = Instant::now();
        let outcome = tokio::time::timeout(timeout * 5, raw::run(&opts))
            .await
            .expect("raw::run returned instead of hanging");
        let err = outcome.expect_err("no NATS there");
        assert!(
            matches!(err, RawError::Nats { .. } | RawError::Timeout { .. }),
            "{addr}: {err:?}"
        );
        assert!(
            started.elapsed() < timeout + Duration::from_secs(1),
            "{addr}: {:?}",
            started.elapsed()
        );
    }
    Ok(())
}

#[tokio::test]
async fn bad_options_are_refused_before_connecting() {
    let ok = options("nats://127.0.0.1:1".into(), "x", 10, 0.0);
    for bad in [
        RawOptions {
            run_id: "a.b".into(),
            ..ok.clone()
        },
        RawOptions {
            count: 0,
            ..ok.clone()
        },
        RawOptions {
            window: 0,
            ..ok.clone()
        },
        RawOptions {
            rate_per_s: f64::NAN,
            ..ok.clone()
        },
    ] {
        let err = raw::run(&bad).await.expect_err("refused");
        assert!(matches!(err, RawError::Options(_)), "{err:?}");
    }
}

/// The figures for the report: `cargo test --release -p chronoshard-loadtest --test raw -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a measurement, not a check: takes a minute"]
async fn measure_ceiling_and_5k_per_s() -> anyhow::Result<()> {
    let nats = Nats::start().await?;
    let count = std::env::var("RAW_COUNT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let window = std::env::var("RAW_WINDOW")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    for (i, (count, rate)) in [(count, 0.0), (50_000, 5_000.0)].into_iter().enumerate() {
        let opts = RawOptions {
            window,
            ..options(nats.url(), &format!("measure-{i}"), count, rate)
        };
        let s = raw::run(&opts).await?;
        let p = s.round_trip_ms;
        println!(
            "rate {rate}/s window {window}: {count} in, {:.0}/s; round trip ms p50 {:.3} p90 {:.3} p99 {:.3} p99.9 {:.3} max {:.3}",
            s.per_s, p.p50, p.p90, p.p99, p.p999, p.max
        );
    }
    Ok(())
}
