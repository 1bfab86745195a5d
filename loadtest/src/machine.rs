//! The machine a run measured on, from `/proc` (Linux): the report states it beside every figure.

use crate::report::Machine;

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
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn describes_this_machine() {
        let m = super::describe();
        assert!(m.cpus >= 1 && m.memory_bytes > 0 && !m.kernel.is_empty());
    }
}
