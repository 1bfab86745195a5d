//! Cost of `next_after` for typical expressions. Ignored by default (timing in a shared debug
//! build is noise); run with
//! `cargo test --release -p chronoshard-schedule --test throughput -- --ignored --nocapture`.

use std::time::Instant;

use chronoshard_schedule::{Cron, DateTime, Utc};

#[test]
#[ignore = "timing; run in release"]
fn next_after_costs_microseconds() {
    let cases = [
        ("*/5 * * * *", "UTC"),
        ("0 30 2 * * *", "Europe/Berlin"),
        ("*/30 * * * *", "America/New_York"),
        ("0 9 * * MON-FRI", "Australia/Lord_Howe"),
        ("15 10 1 * *", "Asia/Kolkata"),
        ("0 0 29 2 *", "UTC"),
        ("*/10 * * * * *", "Europe/Berlin"),
        // Quartz day tokens and a macro.
        ("0 0 L * *", "UTC"),
        ("0 30 2 LW * *", "Europe/Berlin"),
        ("0 9 15W * *", "America/New_York"),
        ("0 2 * * 0L", "Europe/Berlin"),
        ("0 0 * * 5#5", "UTC"),
        ("@daily", "America/Sao_Paulo"),
    ];
    let start: DateTime<Utc> = "2026-01-01T00:00:00Z".parse().unwrap();
    for (expr, tz) in cases {
        let cron = Cron::parse(expr, tz).unwrap();
        let n = 20_000;
        // The best of five rounds: on a shared machine the others measure the neighbours.
        let mut best = std::time::Duration::MAX;
        let mut t = start;
        for _ in 0..5 {
            let t0 = Instant::now();
            t = start;
            for _ in 0..n {
                t = cron.next_after(t).unwrap();
            }
            best = best.min(t0.elapsed() / n);
        }
        println!("{expr:>20} {tz:>20}: {best:?} per next_after (reached {t})");
        assert!(best.as_micros() < 50, "{expr}: {best:?}");
    }
}
