//! The machine a run measured on, from `/proc` (Linux), and what a wake-up costs on it: the
//! report states both beside every figure. It owns these measurements and nothing of the run.

use std::{sync::mpsc, time::Instant};

use nix::{
    sched::{sched_getaffinity, sched_setaffinity, CpuSet},
    time::{clock_gettime, ClockId},
    unistd::Pid,
};

use crate::report::{Machine, RoundTrip, WakeCost};

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The 1-minute load average.
pub fn load() -> f64 {
    read("/proc/loadavg")
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

pub fn describe() -> Machine {
    let cpuinfo = read("/proc/cpuinfo");
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let memory_bytes = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kib| kib.parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .unwrap_or(0);
    Machine {
        hostname: read("/proc/sys/kernel/hostname").trim().to_string(),
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        cpu_model,
        memory_bytes,
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        load_start: load(),
        load_end: 0.0,
        wake: WakeCost::default(),
    }
}

/// `describe`, with the wake-up cost measured on threads of their own (it takes a few tenths of
/// a second, which must not hold a runtime thread), and a warning when it could not be.
pub async fn measured() -> (Machine, Option<String>) {
    let mut m = describe();
    m.wake = tokio::task::spawn_blocking(|| wake_cost(WAKE_BATCHES, WAKE_ROUND_TRIPS))
        .await
        .unwrap_or_default();
    let warning = not_measured(&m.wake);
    (m, warning)
}

/// The report's warning for a wake-up cost of which no part was measured.
fn not_measured(w: &WakeCost) -> Option<String> {
    w.describe().is_none().then(|| {
        "what a wake-up costs was not measured: its threads could not be started or pinned to \
         a CPU"
            .to_string()
    })
}

/// Batches of `WAKE_ROUND_TRIPS`: the median batch is reported, so a burst of other load on a
/// shared machine moves one batch, not the figure. 2 × 2,000 round trips take 0.2–0.4 s where
/// one costs 50–100 µs.
const WAKE_BATCHES: usize = 5;
const WAKE_ROUND_TRIPS: u32 = 400;

/// Asks the echo thread for the CPU it has used so far.
const REPORT_CPU: u64 = u64::MAX;

/// This thread's CPU time in ns.
fn thread_cpu_ns() -> Option<i64> {
    let t = clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).ok()?;
    Some(t.tv_sec() * 1_000_000_000 + t.tv_nsec())
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) -> Option<()> {
    let mut set = CpuSet::new();
    set.set(cpu).ok()?;
    sched_setaffinity(Pid::from_raw(0), &set).ok()
}

/// The first two CPUs this process may run on (its affinity mask, not a cgroup's CPU quota:
/// threads can be pinned to a CPU the quota would share out).
pub fn first_two_cpus() -> Vec<usize> {
    let allowed = sched_getaffinity(Pid::from_raw(0)).ok();
    (0..CpuSet::count())
        .filter(|&c| allowed.is_some_and(|a| a.is_set(c).unwrap_or(false)))
        .take(2)
        .collect()
}

/// Measures `WakeCost` on `first_two_cpus` (one: `cross_core` is None). A part is None when its
/// threads cannot be started or pinned.
pub fn wake_cost(batches: usize, round_trips: u32) -> WakeCost {
    let cpus = first_two_cpus();
    let trips = |a: usize, b: usize| round_trips_between(a, b, batches, round_trips);
    match cpus[..] {
        [a, b] => WakeCost {
            cross_core: trips(a, b),
            same_core: trips(a, a),
        },
        [a] => WakeCost {
            cross_core: None,
            same_core: trips(a, a),
        },
        _ => WakeCost::default(),
    }
}

/// A thread pinned to `mine` and an echo thread pinned to `echo`'s pass a number back and
/// forth over channels, each blocking until the other's message wakes it. Both are new threads,
/// so the caller's own affinity stays as it was.
fn round_trips_between(mine: usize, echo: usize, batches: usize, n: u32) -> Option<RoundTrip> {
    let (to_echo, echo_in) = mpsc::channel::<u64>();
    let (echo_out, from_echo) = mpsc::channel::<u64>();
    let echo = std::thread::Builder::new()
        .name("wake-echo".into())
        .spawn(move || {
            if pin(echo).is_none() {
                return;
            }
            for v in echo_in {
                // The CPU reading is a system call, so it is taken only between batches.
                let reply = match v {
                    REPORT_CPU => thread_cpu_ns().map_or(REPORT_CPU, |ns| ns as u64),
                    v => v,
                };
                if echo_out.send(reply).is_err() {
                    return;
                }
            }
        })
        .ok()?;
    let measure = std::thread::Builder::new()
        .name("wake-measure".into())
        .spawn(move || {
            pin(mine)?;
            let trip = |v: u64| -> Option<u64> {
                to_echo.send(v).ok()?;
                from_echo.recv().ok()
            };
            let echo_cpu = || match trip(REPORT_CPU)? {
                REPORT_CPU => None,
                ns => Some(ns as i64),
            };
            // Warm up: both threads running, their stacks touched.
            for i in 0..50 {
                trip(i)?;
            }
            // ns per round trip, one of each per batch.
            let (mut cpu, mut wall) = (Vec::new(), Vec::new());
            for _ in 0..batches {
                let (echo0, mine0, t0) = (echo_cpu()?, thread_cpu_ns()?, Instant::now());
                for i in 0..n {
                    trip(u64::from(i))?;
                }
                let (elapsed, mine1, echo1) = (t0.elapsed(), thread_cpu_ns()?, echo_cpu()?);
                cpu.push(((mine1 - mine0) + (echo1 - echo0)) / i64::from(n));
                wall.push(elapsed.as_nanos() as i64 / i64::from(n));
            }
            Some(RoundTrip {
                cpu_us: median(cpu)? as f64 / 1000.0,
                wall_us: median(wall)? as f64 / 1000.0,
            })
        })
        .ok()?;
    // The measuring thread's end drops its sender, which ends the echo thread.
    let measured = measure.join().ok()?;
    let _ = echo.join();
    measured
}

/// The middle value (the upper one of an even count).
fn median(mut v: Vec<i64>) -> Option<i64> {
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

#[cfg(test)]
mod tests {
    #[test]
    fn describes_this_machine() {
        let m = super::describe();
        assert!(m.cpus >= 1 && m.memory_bytes > 0 && !m.kernel.is_empty());
    }

    #[test]
    fn a_wake_up_costs_cpu_and_time_on_one_core_and_across_two() {
        let mask = || nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
        let before = mask();
        let w = super::wake_cost(3, 50);
        assert_eq!(mask(), before, "the caller's affinity is left alone");
        let cpus = super::first_two_cpus().len();
        assert_eq!(w.cross_core.is_some(), cpus >= 2, "{w:?}");
        assert!(w.same_core.is_some(), "{w:?}");
        for t in [w.same_core, w.cross_core].into_iter().flatten() {
            // Two wake-ups and four channel operations cannot be free. Two threads that take
            // turns use at most twice the wall time, plus the echo's one extra wake-up per
            // batch (the CPU reading), which 1 µs covers at these sizes.
            assert!(t.cpu_us > 0.0 && t.wall_us > 0.0, "{w:?}");
            assert!(t.cpu_us <= 2.0 * t.wall_us + 1.0, "{w:?}");
        }
    }

    #[test]
    fn a_wake_up_cost_not_measured_is_a_warning() {
        let none = super::WakeCost::default();
        assert!(super::not_measured(&none).unwrap().contains("not measured"));
        let one = super::WakeCost {
            same_core: Some(super::RoundTrip {
                cpu_us: 4.0,
                wall_us: 4.0,
            }),
            ..none
        };
        assert_eq!(super::not_measured(&one), None);
    }

    #[test]
    fn the_median_is_the_middle_value() {
        assert_eq!(super::median(vec![]), None);
        assert_eq!(super::median(vec![9, 1, 5]), Some(5));
        assert_eq!(super::median(vec![4, 1, 3, 2]), Some(3));
    }
}
