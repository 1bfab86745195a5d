//! The node's CPU use between two heartbeats, in cores: the process's CPU time (every thread,
//! `CLOCK_PROCESS_CPUTIME_ID`) over the wall time that passed. The arithmetic is pure; `sample`
//! is the one read of the clock.

use std::time::{Duration, Instant};

/// The process's CPU time so far, or None where the clock cannot be read.
pub fn process_cpu() -> Option<Duration> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID).ok()?;
    Some(Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32))
}

/// Remembers the previous reading.
#[derive(Debug, Default)]
pub struct CpuMeter {
    last: Option<(Instant, Duration)>,
}

impl CpuMeter {
    /// Cores used since the previous reading: None at the first, or when no wall time passed.
    pub fn sample(&mut self, at: Instant, cpu: Duration) -> Option<f64> {
        let previous = self.last.replace((at, cpu));
        let (then, cpu_then) = previous?;
        let wall = at.checked_duration_since(then)?.as_secs_f64();
        if wall <= 0.0 {
            return None;
        }
        Some(cpu.saturating_sub(cpu_then).as_secs_f64() / wall)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_are_cpu_time_over_wall_time() {
        let mut m = CpuMeter::default();
        let t0 = Instant::now();
        assert_eq!(m.sample(t0, Duration::from_millis(500)), None);
        // 1.5 s of CPU in 1 s: one and a half cores.
        let got = m.sample(t0 + Duration::from_secs(1), Duration::from_millis(2_000));
        assert!((got.unwrap() - 1.5).abs() < 1e-9, "{got:?}");
        // No wall time passed: no figure rather than a division by zero.
        assert_eq!(
            m.sample(t0 + Duration::from_secs(1), Duration::from_millis(2_100)),
            None
        );
        // A clock that went backwards counts as nothing used.
        let got = m.sample(t0 + Duration::from_secs(3), Duration::from_millis(1_000));
        assert_eq!(got, Some(0.0));
    }

    #[test]
    fn the_process_clock_moves_when_the_process_works() {
        let before = process_cpu().expect("process CPU clock");
        let start = Instant::now();
        let mut x = 0u64;
        // Busy until the clock has moved (a deadline keeps a broken clock from hanging).
        while process_cpu().unwrap() <= before && start.elapsed() < Duration::from_secs(10) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        assert!(process_cpu().unwrap() > before);
    }
}
