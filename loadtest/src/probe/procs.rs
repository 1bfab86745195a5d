//! CPU time and memory of the processes a run involves, read from `/proc` (Linux): sampled every
//! half second so the peak resident set is seen even for a process that is killed later, and the
//! CPU used during the run is the difference between the first and the last sample.

use std::{collections::BTreeMap, time::Duration};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{progress::now_us, report::ProcessStats};

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
}

/// What the sampler is told to watch: (name, pid) pairs, changeable while it runs (a restarted
/// worker is a new pid).
pub type Watched = std::sync::Arc<std::sync::Mutex<Vec<(String, u32)>>>;

/// Samples every watched process until `stop`, then returns one row per (name, pid).
pub fn spawn_sampler(watched: Watched, stop: CancellationToken) -> JoinHandle<Vec<ProcessStats>> {
    tokio::spawn(async move {
        let mut seen: BTreeMap<(String, u32), Seen> = BTreeMap::new();
        let mut tick = tokio::time::interval(Duration::from_millis(500));
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
                e.last = Some(s);
                e.last_us = now;
            }
            if stopping {
                break;
            }
        }
        let tick_hz = clock_ticks_per_second() as f64;
        seen.into_iter()
            .map(|((_, pid), s)| {
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
            .collect()
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
    fn samples_this_process() {
        let s = sample(std::process::id()).expect("own /proc entry");
        assert!(s.rss_bytes > 0 && s.hwm_bytes >= s.rss_bytes);
        assert!(children(u32::MAX).is_empty());
    }
}
