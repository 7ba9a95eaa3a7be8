//! The standard `process_*` metrics, read from `/proc/self` at each scrape (Linux only; on
//! other systems they are left out).

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};

/// Reads `/proc/self/{stat,fd,limits}` when scraped.
#[derive(Debug)]
pub struct ProcessCollector {
    /// Clock ticks per second and page size, for `stat`'s units.
    ticks_per_second: f64,
    page_size: f64,
}

impl ProcessCollector {
    /// A collector for this process.
    pub fn new() -> Self {
        // SAFETY: sysconf has no preconditions.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        ProcessCollector {
            ticks_per_second: if ticks > 0 { ticks as f64 } else { 100.0 },
            page_size: if page > 0 { page as f64 } else { 4096.0 },
        }
    }
}

/// What `/proc/self/stat` says, in base units.
struct Stat {
    cpu_seconds: f64,
    virtual_bytes: f64,
    resident_bytes: f64,
    start_time_seconds: f64,
}

impl ProcessCollector {
    fn stat(&self) -> Option<Stat> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The command name (field 2) may hold spaces and parentheses: fields count from the
        // last ')'. After it, field 3 is at index 0.
        let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split(' ').collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
        let boot_time = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse::<f64>()
            .ok()?;
        Some(Stat {
            cpu_seconds: (field(14)? + field(15)?) / self.ticks_per_second,
            virtual_bytes: field(23)?,
            resident_bytes: field(24)? * self.page_size,
            start_time_seconds: boot_time + field(22)? / self.ticks_per_second,
        })
    }
}

fn open_fds() -> Option<f64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as f64)
}

fn max_fds() -> Option<f64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: f64) -> std::fmt::Result {
    let gauge = ConstGauge::new(value);
    gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        if let Some(stat) = self.stat() {
            let cpu = ConstCounter::new(stat.cpu_seconds);
            cpu.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "User and system CPU time spent, in seconds",
                None,
                cpu.metric_type(),
            )?)?;
            gauge(
                &mut encoder,
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                stat.resident_bytes,
            )?;
            gauge(
                &mut encoder,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                stat.virtual_bytes,
            )?;
            gauge(
                &mut encoder,
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch, in seconds",
                stat.start_time_seconds,
            )?;
        }
        if let Some(open) = open_fds() {
            // The directory handle read_dir held is closed again; it is counted, as Go's
            // client counts it.
            gauge(
                &mut encoder,
                "process_open_fds",
                "Open file descriptors",
                open,
            )?;
        }
        if let Some(max) = max_fds() {
            gauge(
                &mut encoder,
                "process_max_fds",
                "Most file descriptors the process may open",
                max,
            )?;
        }
        Ok(())
    }
}
