//! The host TSC frequency, for TCG guests.
//!
//! Under TCG, QEMU's `rdtsc` returns the host's TSC, so the guest TSC ticks
//! at the host TSC rate. The guest kernel normally calibrates it against the
//! PIT, but under emulation that calibration is noisy: it fails about one boot
//! in ten ("tsc: Unable to calibrate against PIT ... Marking TSC unstable"),
//! and such a boot then hangs before printing anything. Measuring the rate on
//! the host and passing `tsc_early_khz=` makes the guest skip the calibration.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The host TSC rate in kHz, measured once per process (about 50 ms).
pub fn host_tsc_khz() -> Option<u64> {
    static KHZ: OnceLock<Option<u64>> = OnceLock::new();
    *KHZ.get_or_init(measure)
}

#[cfg(target_arch = "x86_64")]
fn measure() -> Option<u64> {
    // Take the best of a few short windows: preemption only ever makes a
    // window look longer in one clock than the other, so keep the median.
    let mut samples = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        // SAFETY: rdtsc has no side effects and is available on every x86_64.
        let c0 = unsafe { core::arch::x86_64::_rdtsc() };
        std::thread::sleep(Duration::from_millis(10));
        // SAFETY: as above.
        let c1 = unsafe { core::arch::x86_64::_rdtsc() };
        let ns = t0.elapsed().as_nanos() as u64;
        if ns == 0 || c1 <= c0 {
            return None;
        }
        samples.push((c1 - c0) * 1_000_000 / ns);
    }
    samples.sort_unstable();
    let khz = samples[samples.len() / 2];
    // Anything outside 100 MHz..10 GHz is a broken measurement.
    (100_000..10_000_000).contains(&khz).then_some(khz)
}

#[cfg(not(target_arch = "x86_64"))]
fn measure() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn measured_rate_is_plausible_and_stable() {
        let a = super::measure().expect("x86_64 host has a TSC");
        let b = super::measure().expect("x86_64 host has a TSC");
        let diff = a.abs_diff(b) as f64 / a as f64;
        assert!(diff < 0.05, "{a} vs {b}");
    }
}
