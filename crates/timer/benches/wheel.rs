//! Criterion benchmarks of the wheel at 1 M entries with a 16-byte payload (`u128`), for the
//! project's acceptance target (insert + expire under 100 ns per operation):
//!
//! * `fill_drain_1m/{fresh,reused}`: insert 1 M entries with deadlines uniform over a 5-minute
//!   horizon, then advance through them in 1 ms steps (300 000 `advance` calls). One iteration
//!   is 1 M insert+expire operations: divide the reported time by 1 M for ns/op (the throughput
//!   line says the same in elements/s). `fresh` builds a new wheel each time (its page faults
//!   are timed: a shard's first load); `reused` keeps one wheel, so cells come off the free list
//!   in scattered order, as in a long-running shard.
//! * `steady_1m/insert_expire`: a wheel holding ~1 M entries; one iteration inserts one entry
//!   (deadline uniform within 5 min) and advances the clock by 0.15 ms, which at that arrival
//!   rate expires one entry on average, so the population stays at 1 M.
//! * `cancel_1m/random`: cancel every entry of a 1 M-entry wheel, in random order, with time
//!   standing still: a worst case for the wheel's record of pending cancels, which grows to 1 M.
//!   One iteration is 1 M cancels.
//!
//! Runs are kept short for a 2-core machine (10 samples, a few seconds each):
//! `CARGO_TARGET_DIR=/tmp/target-timer cargo bench -p chronoshard-timer`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use chronoshard_timer::{TimerKey, TimerWheel};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, SamplingMode, Throughput};

const NOW: u64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z
const HORIZON: u64 = 300_000; // 5 minutes in ms
const N: usize = 1_000_000;

/// splitmix64: a dependency-free, reproducible random source.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `1..=n` (modulo bias is irrelevant here).
    fn offset(&mut self, n: u64) -> u64 {
        1 + self.next() % n
    }
}

/// Offsets (from the start time) uniform over the horizon.
fn uniform_offsets(seed: u64) -> Vec<u64> {
    let mut rng = Rng(seed);
    (0..N).map(|_| rng.offset(HORIZON)).collect()
}

/// One round of (a): insert everything relative to `start`, then walk 1 ms at a time to
/// `start + HORIZON`. Returns how many entries came out.
fn fill_and_drain(
    wheel: &mut TimerWheel<u128>,
    start: u64,
    offsets: &[u64],
    out: &mut Vec<(u64, u128)>,
) -> usize {
    for (i, off) in offsets.iter().enumerate() {
        wheel.insert(start + off, i as u128);
    }
    let mut fired = 0;
    for t in start + 1..=start + HORIZON {
        wheel.advance(t, out);
        fired += out.len();
        out.clear();
    }
    fired
}

fn fill_drain(c: &mut Criterion) {
    let offsets = uniform_offsets(1);
    let mut g = c.benchmark_group("fill_drain_1m");
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .throughput(Throughput::Elements(N as u64));

    g.bench_function("fresh", |b| {
        b.iter_batched(
            || (TimerWheel::with_capacity(NOW, N), Vec::with_capacity(64)),
            |(mut wheel, mut out)| {
                let fired = fill_and_drain(&mut wheel, NOW, &offsets, &mut out);
                assert_eq!(fired, N);
                wheel // dropped outside the timed section
            },
            BatchSize::PerIteration,
        )
    });

    let mut wheel = TimerWheel::with_capacity(NOW, N);
    let mut out = Vec::with_capacity(64);
    g.bench_function("reused", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = wheel.now();
                let t0 = Instant::now();
                let fired = fill_and_drain(&mut wheel, start, &offsets, &mut out);
                total += t0.elapsed();
                assert_eq!(fired, N);
            }
            total
        })
    });
    g.finish();
}

fn steady(c: &mut Criterion) {
    let mut rng = Rng(2);
    let mut wheel = TimerWheel::with_capacity(NOW, N + N / 8);
    // In steady state with lifetimes uniform over the horizon, remaining time r has density
    // proportional to (1 - r / HORIZON): sample that so the run starts in equilibrium.
    for i in 0..N {
        let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
        let r = (HORIZON as f64 * (1.0 - u.sqrt())) as u64;
        wheel.insert(NOW + 1 + r, i as u128);
    }
    let mut out = Vec::with_capacity(64);
    // Arrival rate 1 M / (HORIZON / 2) = 20 inserts per 3 ms keeps the population at 1 M.
    let mut ticks = 0u32;
    let mut item = 0u128;
    let mut g = c.benchmark_group("steady_1m");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    g.bench_function("insert_expire", |b| {
        b.iter_custom(|iters| {
            let t0 = Instant::now();
            for _ in 0..iters {
                item += 1;
                let now = wheel.now();
                wheel.insert(now + rng.offset(HORIZON), item);
                ticks += 3;
                if ticks >= 20 {
                    ticks -= 20;
                    wheel.advance(now + 1, &mut out);
                    black_box(&out);
                    out.clear();
                }
            }
            t0.elapsed()
        })
    });
    g.finish();
    eprintln!(
        "steady_1m: wheel holds {} entries at the end (target ~1 M)",
        wheel.len()
    );
}

fn cancel(c: &mut Criterion) {
    let mut rng = Rng(3);
    let offsets = uniform_offsets(4);
    let mut g = c.benchmark_group("cancel_1m");
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .throughput(Throughput::Elements(N as u64));
    g.bench_function("random", |b| {
        b.iter_batched(
            || {
                let mut wheel = TimerWheel::with_capacity(NOW, N);
                let mut keys: Vec<TimerKey> = offsets
                    .iter()
                    .enumerate()
                    .map(|(i, off)| wheel.insert(NOW + off, i as u128))
                    .collect();
                // Fisher-Yates with the bench's own generator.
                for i in (1..keys.len()).rev() {
                    keys.swap(i, (rng.next() % (i as u64 + 1)) as usize);
                }
                (wheel, keys)
            },
            |(mut wheel, keys)| {
                for key in &keys {
                    black_box(wheel.cancel(*key));
                }
                assert!(wheel.is_empty());
                wheel // dropped outside the timed section
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, fill_drain, steady, cancel);
criterion_main!(benches);
