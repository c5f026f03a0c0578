//! What the commit benchmark reads of the machine: the file system of its
//! data directories and the CPU time other processes use (from /proc), to
//! wait for a quiet machine and to report what a case shared it with.
//! Reads only; never changes the machine.

use std::fmt::Debug;
use std::path::Path;
use std::time::{Duration, Instant};

/// The file system holding `path`, from /proc/mounts: (type, device, mount
/// point).
pub(crate) fn file_system_of(path: &Path) -> Option<(String, String, String)> {
    let path = path.canonicalize().ok()?;
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (device, point, kind) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(point)
                .then(|| (kind.to_string(), device.to_string(), point.to_string()))
        })
        .max_by_key(|(_, _, point)| point.len())
}

/// CPU time counters, in clock ticks: the machine's (from /proc/stat) and
/// this process's (from /proc/self/stat).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CpuSample {
    /// All CPUs, every state.
    total: u64,
    /// All CPUs, busy (user, nice, system, irq, softirq).
    busy: u64,
    /// Time the hypervisor ran something else.
    steal: u64,
    /// This process (user + system).
    own: u64,
}

impl CpuSample {
    pub(crate) fn now() -> CpuSample {
        let mut sample = CpuSample::default();
        if let Ok(stat) = std::fs::read_to_string("/proc/stat")
            && let Some(line) = stat.lines().next()
        {
            let v: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            if v.len() >= 8 {
                // user nice system idle iowait irq softirq steal (guest
                // time is already inside user and nice).
                sample.total = v[..8].iter().sum();
                sample.busy = v[0] + v[1] + v[2] + v[5] + v[6];
                sample.steal = v[7];
            }
        }
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat")
            && let Some(after_name) = stat.rsplit_once(')').map(|(_, rest)| rest)
        {
            // Fields after the name start at field 3; utime and stime are
            // fields 14 and 15.
            let f: Vec<&str> = after_name.split_whitespace().collect();
            if f.len() > 12 {
                sample.own = f[11].parse::<u64>().unwrap_or(0) + f[12].parse::<u64>().unwrap_or(0);
            }
        }
        sample
    }
}

/// Where the machine's CPU time went between two samples, in percent of all
/// CPUs.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CpuShare {
    pub(crate) own: f64,
    pub(crate) others: f64,
    pub(crate) steal: f64,
}

pub(crate) fn cpu_share(a: CpuSample, b: CpuSample) -> CpuShare {
    let total = b.total.saturating_sub(a.total).max(1) as f64;
    let busy = b.busy.saturating_sub(a.busy) as f64;
    let own = b.own.saturating_sub(a.own) as f64;
    CpuShare {
        own: 100.0 * own / total,
        others: 100.0 * (busy - own).max(0.0) / total,
        steal: 100.0 * b.steal.saturating_sub(a.steal) as f64 / total,
    }
}

/// Waits, at most `limit`, until the rest of the machine leaves the CPUs
/// (less than `threshold` percent busy over a second); returns how long it
/// waited and the last share seen.
pub(crate) fn settle(limit: Duration, threshold: f64) -> (Duration, CpuShare) {
    let started = Instant::now();
    loop {
        let a = CpuSample::now();
        std::thread::sleep(Duration::from_secs(1));
        let share = cpu_share(a, CpuSample::now());
        if share.others + share.steal < threshold || started.elapsed() >= limit {
            return (started.elapsed(), share);
        }
    }
}
