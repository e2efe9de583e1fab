//! Power estimated from CPU utilisation where no meter can be read (no RAPL, no Redfish,
//! no Prometheus source: every VM): a named, published model with its coefficients, kept
//! apart from measured watts everywhere it is shown.
//!
//! The model is Cloud Carbon Footprint's compute model (its methodology's "Compute"
//! section): per vCPU, `min + utilisation x (max - min)` watts, with its averages over
//! AWS's processor micro-architectures from the SPECpower database when the processor is
//! not known, 0.74 W at idle and 3.5 W at full load, no data-centre overhead (PUE). It
//! restates CPU time as watts: it cannot see what the CPU does per cycle, memory, disks,
//! or a QAT device's own power, so it ranks providers exactly as CPU utilisation does.

use serde::{Deserialize, Serialize};

/// A linear per-vCPU power model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PowerModel {
    /// Its name and source, as reports print it.
    pub name: &'static str,
    /// Watts per vCPU at 0 % utilisation.
    pub idle_watts_per_vcpu: f64,
    /// Watts per vCPU at 100 % utilisation.
    pub full_watts_per_vcpu: f64,
}

/// Cloud Carbon Footprint's AWS averages (cloudcarbonfootprint.org, Methodology, Compute).
pub const CCF_AWS_AVERAGE: PowerModel = PowerModel {
    name: "Cloud Carbon Footprint compute model, AWS average coefficients (SPECpower)",
    idle_watts_per_vcpu: 0.74,
    full_watts_per_vcpu: 3.5,
};

/// One run's estimate.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PowerEstimate {
    /// The model, by name.
    pub model: String,
    /// Its idle coefficient, W per vCPU.
    pub idle_watts_per_vcpu: f64,
    /// Its full-load coefficient, W per vCPU.
    pub full_watts_per_vcpu: f64,
    /// vCPUs of the host (the cores loadgen counted).
    pub vcpus: usize,
    /// The host's measured utilisation over the measured phase, 0..=100.
    pub utilisation_percent: f64,
    /// Estimated mean power.
    pub mean_watts: f64,
    /// Estimated energy over the measured phase.
    pub joules: f64,
}

impl PowerModel {
    /// The estimate for `vcpus` at `utilisation_percent` over `seconds`.
    pub fn estimate(&self, vcpus: usize, utilisation_percent: f64, seconds: f64) -> PowerEstimate {
        let u = (utilisation_percent / 100.0).clamp(0.0, 1.0);
        let per_vcpu =
            self.idle_watts_per_vcpu + u * (self.full_watts_per_vcpu - self.idle_watts_per_vcpu);
        let mean_watts = per_vcpu * vcpus as f64;
        PowerEstimate {
            model: self.name.to_owned(),
            idle_watts_per_vcpu: self.idle_watts_per_vcpu,
            full_watts_per_vcpu: self.full_watts_per_vcpu,
            vcpus,
            utilisation_percent,
            mean_watts,
            joules: mean_watts * seconds,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The coefficients as the model publishes them, and the figures worked by hand.
    #[test]
    fn the_model_gives_its_published_coefficients_and_hand_worked_figures() {
        assert_eq!(CCF_AWS_AVERAGE.idle_watts_per_vcpu, 0.74);
        assert_eq!(CCF_AWS_AVERAGE.full_watts_per_vcpu, 3.5);
        // 2 vCPUs at 50 %: 2 x (0.74 + 0.5 x 2.76) = 4.24 W; over 10 s, 42.4 J.
        let e = CCF_AWS_AVERAGE.estimate(2, 50.0, 10.0);
        assert!((e.mean_watts - 4.24).abs() < 1e-9, "{e:?}");
        assert!((e.joules - 42.4).abs() < 1e-9, "{e:?}");
        // Idle and full load are the coefficients themselves; out-of-range readings clamp.
        assert!((CCF_AWS_AVERAGE.estimate(4, 0.0, 1.0).mean_watts - 2.96).abs() < 1e-9);
        assert!((CCF_AWS_AVERAGE.estimate(4, 100.0, 1.0).mean_watts - 14.0).abs() < 1e-9);
        assert!((CCF_AWS_AVERAGE.estimate(1, 130.0, 1.0).mean_watts - 3.5).abs() < 1e-9);
    }
}
