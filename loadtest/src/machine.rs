//! The machine a run measured on, from `/proc` (Linux), and what a wake-up costs on it: the
//! report states both beside every figure.

use std::{sync::mpsc, time::Instant};

use nix::{
    sched::{sched_getaffinity, sched_setaffinity, CpuSet},
    time::{clock_gettime, ClockId},
    unistd::Pid,
};

use crate::{
    report::{Machine, RoundTrip, WakeCost},
    stats::Samples,
};

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
        wake: wake_cost(WAKE_BATCHES, WAKE_ROUND_TRIPS),
    }
}

/// Batches of `WAKE_ROUND_TRIPS`: the median batch is reported, so a burst of other load on a
/// shared machine moves one batch, not the figure. 2 × 2,000 round trips take 0.4 s where one
/// costs 100 µs.
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

/// Measures `WakeCost` on the first two cores this process may run on (one: `cross_core` is
/// None). A part is None when its threads cannot be started or pinned.
pub fn wake_cost(batches: usize, round_trips: u32) -> WakeCost {
    let allowed = sched_getaffinity(Pid::from_raw(0)).ok();
    let cpus: Vec<usize> = (0..CpuSet::count())
        .filter(|&c| allowed.is_some_and(|a| a.is_set(c).unwrap_or(false)))
        .take(2)
        .collect();
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
            // Samples' quantiles do not care about the unit: these are ns per round trip.
            let (mut cpu, mut wall) = (Samples::new(), Samples::new());
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
                cpu_us: cpu.quantile_us(0.5)? as f64 / 1000.0,
                wall_us: wall.quantile_us(0.5)? as f64 / 1000.0,
            })
        })
        .ok()?;
    // The measuring thread's end drops its sender, which ends the echo thread.
    let measured = measure.join().ok()?;
    let _ = echo.join();
    measured
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
        let w = super::wake_cost(3, 50);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(w.cross_core.is_some(), cores >= 2, "{w:?}");
        for t in [w.same_core, w.cross_core].into_iter().flatten() {
            // Two wake-ups and four channel operations cannot be free, and two threads that
            // take turns cannot use more CPU than twice the wall time (the readings between
            // batches fall outside both; 1 µs covers the one extra wake-up they add).
            assert!(t.cpu_us > 0.0 && t.wall_us > 0.0, "{w:?}");
            assert!(t.cpu_us <= 2.0 * t.wall_us + 1.0, "{w:?}");
        }
        assert!(w.same_core.is_some(), "{w:?}");
    }
}
