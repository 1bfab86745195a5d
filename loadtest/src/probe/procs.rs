//! CPU time and memory of the processes a run involves, read from `/proc` (Linux): sampled every
//! 100 ms so the peak resident set is seen even for a process that is killed later, and the
//! CPU used during the run is the difference between the first and the last sample. The samples
//! are kept, so the CPU a process used within any window of the run (the firing, say) can be
//! read off afterwards (`cpu_between`).

use std::{collections::BTreeMap, time::Duration};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{
    progress::now_us,
    report::{CpuPerUnit, ProcessStats},
};

#[derive(Clone, Debug, Default, PartialEq)]
struct Sample {
    cpu_ticks: u64,
    rss_bytes: u64,
    hwm_bytes: u64,
}

#[derive(Clone, Debug, Default)]
struct Seen {
    name: String,
    first: Option<Sample>,
    last: Option<Sample>,
    /// When the first and the last sample were taken (µs): a process's share of a core is
    /// over its own time in the run (a restarted worker's, a killed node's).
    first_us: i64,
    last_us: i64,
    peak_rss: u64,
    cpu: Vec<(i64, u64)>,
}

/// One process's CPU time as sampled: (time in µs since the epoch, clock ticks used so far).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CpuSeries {
    pub name: String,
    pub pid: u32,
    pub points: Vec<(i64, u64)>,
}

impl CpuSeries {
    /// CPU seconds the process used between `from_us` and `to_us`, interpolated linearly
    /// between the samples around each end. None unless samples cover the whole window (a
    /// process that started late or died early), or when the window is empty.
    pub fn cpu_between(&self, from_us: i64, to_us: i64) -> Option<f64> {
        if to_us <= from_us {
            return None;
        }
        debug_assert!(
            self.points.windows(2).all(|w| w[0].0 <= w[1].0),
            "samples in time order"
        );
        let at = |t: i64| -> Option<f64> {
            let i = self.points.partition_point(|(pt, _)| *pt < t);
            let (t1, c1) = *self.points.get(i)?;
            if t1 == t {
                return Some(c1 as f64);
            }
            let (t0, c0) = *self.points.get(i.checked_sub(1)?)?;
            let f = (t - t0) as f64 / (t1 - t0) as f64;
            Some(c0 as f64 + f * (c1 as f64 - c0 as f64))
        };
        let ticks = at(to_us)? - at(from_us)?;
        Some(ticks.max(0.0) / clock_ticks_per_second() as f64)
    }
}

/// What the sampler saw: a row per (name, pid) over the whole run, and the CPU samples behind it.
#[derive(Clone, Debug, Default)]
pub struct Sampled {
    pub processes: Vec<ProcessStats>,
    pub cpu: Vec<CpuSeries>,
}

/// CPU seconds `pid` has used so far; None once it is gone.
fn cpu_seconds(pid: u32) -> Option<f64> {
    sample(pid).map(|s| s.cpu_ticks as f64 / clock_ticks_per_second() as f64)
}

/// The CPU time each of `procs` (name, pid) has used so far, for `cpu_since`.
#[derive(Clone, Debug, Default)]
pub struct CpuSnapshot(Vec<(String, u32, f64)>);

impl CpuSnapshot {
    pub fn take(procs: &[(String, u32)]) -> CpuSnapshot {
        CpuSnapshot(
            procs
                .iter()
                .filter_map(|(name, pid)| Some((name.clone(), *pid, cpu_seconds(*pid)?)))
                .collect(),
        )
    }

    /// What each process of this snapshot spent since, per unit of `units` done meanwhile; a
    /// process gone since is left out.
    pub fn cpu_since(&self, units: u64) -> Vec<CpuPerUnit> {
        if units == 0 {
            return Vec::new();
        }
        self.0
            .iter()
            .filter_map(|(name, pid, before)| {
                let spent = cpu_seconds(*pid)? - before;
                Some(CpuPerUnit::of(name, *pid, spent, units))
            })
            .collect()
    }
}

/// What the sampler is told to watch: (name, pid) pairs, changeable while it runs (a restarted
/// worker is a new pid).
pub type Watched = std::sync::Arc<std::sync::Mutex<Vec<(String, u32)>>>;

/// Samples every watched process until `stop`, then returns one row per (name, pid) and the CPU
/// samples.
pub fn spawn_sampler(watched: Watched, stop: CancellationToken) -> JoinHandle<Sampled> {
    tokio::spawn(async move {
        let mut seen: BTreeMap<(String, u32), Seen> = BTreeMap::new();
        // Ticks of USER_HZ (10 ms) and a window of a few seconds: a tenth of a second between
        // samples keeps the interpolation at a window's ends small against what it measures.
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            let stopping = tokio::select! {
                _ = stop.cancelled() => true,
                _ = tick.tick() => false,
            };
            let list = watched.lock().map(|w| w.clone()).unwrap_or_default();
            for (name, pid) in list {
                let Some(s) = sample(pid) else { continue };
                let now = now_us();
                let e = seen.entry((name.clone(), pid)).or_default();
                e.name = name;
                e.peak_rss = e.peak_rss.max(s.rss_bytes);
                if e.first.is_none() {
                    e.first = Some(s.clone());
                    e.first_us = now;
                }
                e.cpu.push((now, s.cpu_ticks));
                e.last = Some(s);
                e.last_us = now;
            }
            if stopping {
                break;
            }
        }
        let tick_hz = clock_ticks_per_second() as f64;
        let mut cpu = Vec::with_capacity(seen.len());
        let processes = seen
            .into_iter()
            .map(|((_, pid), mut s)| {
                cpu.push(CpuSeries {
                    name: s.name.clone(),
                    pid,
                    points: std::mem::take(&mut s.cpu),
                });
                let first = s.first.unwrap_or_default();
                let last = s.last.unwrap_or_default();
                let cpu_s = last.cpu_ticks.saturating_sub(first.cpu_ticks) as f64 / tick_hz;
                let wall_s = ((s.last_us - s.first_us) as f64 / 1e6).max(0.5);
                ProcessStats {
                    name: s.name,
                    pid,
                    cpu_s,
                    cpu_cores: cpu_s / wall_s,
                    peak_rss_bytes: s.peak_rss,
                    hwm_rss_bytes: last.hwm_bytes,
                }
            })
            .collect();
        Sampled { processes, cpu }
    })
}

fn clock_ticks_per_second() -> u64 {
    // USER_HZ is 100 on every Linux architecture this runs on; there is no /proc file for it.
    100
}

fn sample(pid: u32) -> Option<Sample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse(&stat, &status)
}

fn parse(stat: &str, status: &str) -> Option<Sample> {
    // The command name (field 2) may contain spaces and parentheses: fields after the last `)`.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    let cpu_ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|k| k * 1024)
    };
    Some(Sample {
        cpu_ticks,
        rss_bytes: kib("VmRSS:").unwrap_or(0),
        hwm_bytes: kib("VmHWM:").unwrap_or(0),
    })
}

/// The direct children of `pid` (e.g. the nats-server a `chronoshard dev` started).
pub fn children(pid: u32) -> Vec<(String, u32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|child| {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
            let name = stat[stat.find('(')? + 1..stat.rfind(')')?].to_string();
            let ppid: u32 = stat[stat.rfind(')')? + 2..]
                .split(' ')
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == pid).then_some((name, child))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_name_with_spaces_and_parentheses() {
        let stat = "1234 (a (weird) name) S 1 1234 1234 0 -1 4194304 100 0 0 0 250 75 0 0 20 0 8 0 100 1000000 500";
        let status = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        let s = parse(stat, status).unwrap();
        assert_eq!(s.cpu_ticks, 325);
        assert_eq!((s.rss_bytes, s.hwm_bytes), (1024 * 1024, 2048 * 1024));
    }

    #[test]
    fn cpu_between_interpolates_inside_the_samples_only() {
        let series = CpuSeries {
            name: "p".into(),
            pid: 1,
            points: vec![(0, 0), (100, 10), (200, 30), (300, 30)],
        };
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-9);
        // On the samples: 30 ticks of 10 ms.
        assert!(close(series.cpu_between(0, 200), 0.3));
        // Half-way between samples at both ends: 5 → 20 ticks.
        assert!(close(series.cpu_between(50, 150), 0.15));
        // Idle at the end.
        assert!(close(series.cpu_between(200, 300), 0.0));
        // Not covered, or empty.
        assert_eq!(series.cpu_between(-1, 100), None);
        assert_eq!(series.cpu_between(100, 301), None);
        assert_eq!(series.cpu_between(100, 100), None);
        assert_eq!(CpuSeries::default().cpu_between(0, 1), None);
    }

    /// A snapshot of this process sees the CPU it burns afterwards, per unit.
    #[test]
    fn a_snapshot_counts_what_was_spent_since() {
        let me = [("me".to_string(), std::process::id())];
        let gone = [("gone".to_string(), u32::MAX)];
        let before = CpuSnapshot::take(&[me[0].clone(), gone[0].clone()]);
        let start = std::time::Instant::now();
        let mut x = 0u64;
        // Busy until the kernel has counted at least two ticks (20 ms) of it.
        while cpu_seconds(std::process::id()).unwrap() - before.0[0].2 < 0.02 {
            x = x.wrapping_add(std::hint::black_box(1));
            assert!(start.elapsed().as_secs() < 10, "no CPU counted in 10 s");
        }
        let spent = before.cpu_since(10);
        assert_eq!(spent.len(), 1, "the missing process is left out");
        assert!(spent[0].us >= 2_000.0, "{spent:?} ({x})");
        assert!(before.cpu_since(0).is_empty());
    }

    #[test]
    fn samples_this_process() {
        let s = sample(std::process::id()).expect("own /proc entry");
        assert!(s.rss_bytes > 0 && s.hwm_bytes >= s.rss_bytes);
        assert!(children(u32::MAX).is_empty());
    }
}
