//! Standard `process_*` metrics (CPU time, memory, file descriptors, start time), read from
//! `/proc/self` at scrape time through the procfs crate.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Reports the current process's resource use on every scrape.
#[derive(Debug)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Ok(me) = procfs::process::Process::myself() else {
            return Ok(());
        };
        let ticks = procfs::ticks_per_second() as f64;
        let page = procfs::page_size() as f64;
        if let Ok(stat) = me.stat() {
            let cpu = (stat.utime + stat.stime) as f64 / ticks;
            let metric = ConstCounter::new(cpu);
            let e = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                metric.metric_type(),
            )?;
            metric.encode(e)?;
            gauge(
                &mut encoder,
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                stat.rss as f64 * page,
            )?;
            gauge(
                &mut encoder,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                stat.vsize as f64,
            )?;
            if let Ok(boot) = procfs::boot_time_secs() {
                let start = boot as f64 + stat.starttime as f64 / ticks;
                gauge(
                    &mut encoder,
                    "process_start_time_seconds",
                    "Start time since the Unix epoch in seconds",
                    start,
                )?;
            }
        }
        if let Ok(fds) = me.fd_count() {
            gauge(
                &mut encoder,
                "process_open_fds",
                "Number of open file descriptors",
                fds as f64,
            )?;
        }
        Ok(())
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: f64,
) -> Result<(), std::fmt::Error> {
    let metric = ConstGauge::new(value);
    let e = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(e)
}
