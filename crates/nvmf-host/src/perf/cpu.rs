//! CPU placement and per-thread resource usage: `--cpus_allowed` lists, pinning a job thread to
//! its core, and getrusage(RUSAGE_THREAD) for usr_cpu/sys_cpu/ctx.

use std::time::Duration;

/// Parses a CPU list as fio and taskset write it: `0`, `0,2`, `1-3`, `0-1,4`.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("invalid CPU list {s:?}: {part:?} is not N or N-M");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) =
                    (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
                if a > b {
                    return Err(format!("invalid CPU list {s:?}: range {part:?} is reversed"));
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().map_err(|_| bad())?),
        }
    }
    if cpus.is_empty() {
        return Err(format!("invalid CPU list {s:?}: no CPU named"));
    }
    if let Some(&c) = cpus.iter().find(|&&c| c >= libc::CPU_SETSIZE as usize) {
        return Err(format!("invalid CPU list {s:?}: CPU {c} is beyond what the kernel can address"));
    }
    Ok(cpus)
}

/// A parsed `--cpus_allowed` list (a newtype so clap takes it as one value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuList(pub Vec<usize>);

impl std::str::FromStr for CpuList {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        parse_cpu_list(s).map(CpuList)
    }
}

/// Refuses CPUs this process may not run on (its affinity mask: offline CPUs, a cgroup's or
/// taskset's limits), so a typo is an argument error before the run, not a failed pin during it.
pub fn check_allowed(cpus: &[usize]) -> Result<(), String> {
    // SAFETY: cpu_set_t is plain data that sched_getaffinity fills; CPU_ISSET is bounded by the
    // CPU_SETSIZE check of parse_cpu_list.
    let allowed = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Ok(()); // unknown: let pinning report it
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect::<Vec<_>>()
    };
    match cpus.iter().find(|c| !allowed.contains(c)) {
        Some(c) => Err(format!("CPU {c} is not available to this process (it may run on {allowed:?})")),
        None => Ok(()),
    }
}

/// Pins the calling thread to one CPU.
pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET is bounded by parse_cpu_list's CPU_SETSIZE check.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// CPU time and context switches of one thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadUsage {
    pub user: Duration,
    pub sys: Duration,
    pub voluntary_ctx: u64,
    pub involuntary_ctx: u64,
    pub minflt: u64,
    pub majflt: u64,
}

impl ThreadUsage {
    /// getrusage(RUSAGE_THREAD) of the calling thread.
    pub fn now() -> Self {
        // SAFETY: rusage is plain data filled by the kernel.
        let ru = unsafe {
            let mut ru: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_THREAD, &mut ru);
            ru
        };
        let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
        ThreadUsage {
            user: tv(ru.ru_utime),
            sys: tv(ru.ru_stime),
            voluntary_ctx: ru.ru_nvcsw as u64,
            involuntary_ctx: ru.ru_nivcsw as u64,
            minflt: ru.ru_minflt as u64,
            majflt: ru.ru_majflt as u64,
        }
    }

    /// Usage accumulated between `earlier` and `self`.
    pub fn since(&self, earlier: &ThreadUsage) -> ThreadUsage {
        ThreadUsage {
            user: self.user.saturating_sub(earlier.user),
            sys: self.sys.saturating_sub(earlier.sys),
            voluntary_ctx: self.voluntary_ctx.saturating_sub(earlier.voluntary_ctx),
            involuntary_ctx: self.involuntary_ctx.saturating_sub(earlier.involuntary_ctx),
            minflt: self.minflt.saturating_sub(earlier.minflt),
            majflt: self.majflt.saturating_sub(earlier.majflt),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpus_outside_the_affinity_mask_are_refused() {
        super::check_allowed(&[0]).unwrap();
        let e = super::check_allowed(&[0, 1000]).unwrap_err();
        assert!(e.contains("CPU 1000 is not available"), "{e}");
    }

    use super::*;

    #[test]
    fn cpu_lists_parse_like_taskset() {
        assert_eq!(parse_cpu_list("0").unwrap(), vec![0]);
        assert_eq!(parse_cpu_list("0,2").unwrap(), vec![0, 2]);
        assert_eq!(parse_cpu_list("1-3").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_cpu_list("0-1, 4").unwrap(), vec![0, 1, 4]);
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("a").is_err());
        assert!(parse_cpu_list("").is_err());
        assert!(parse_cpu_list("99999").is_err());
    }

    #[test]
    fn thread_usage_grows_with_work() {
        let a = ThreadUsage::now();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let d = ThreadUsage::now().since(&a);
        assert!(d.user + d.sys >= Duration::ZERO);
    }
}
