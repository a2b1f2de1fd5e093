//! Human-readable numbers and durations for explanations, status and timelines.

/// A count or rate with a k/M suffix: 950, 1.5k, 182k, 2.3M.
pub fn si(value: f64) -> String {
    if !value.is_finite() {
        return format!("{value}");
    }
    let magnitude = value.abs();
    let (scaled, suffix) = if magnitude >= 1e6 {
        (value / 1e6, "M")
    } else if magnitude >= 1e3 {
        (value / 1e3, "k")
    } else {
        (value, "")
    };
    let text = if scaled.abs() >= 100.0 || scaled.fract().abs() < 0.05 {
        format!("{scaled:.0}")
    } else {
        format!("{scaled:.1}")
    };
    format!("{text}{suffix}")
}

/// Seconds as a short Go-style duration: 0s, 45s, 4m10s, 2h5m.
pub fn seconds(value: f64) -> String {
    if !value.is_finite() || value < 0.0 {
        return "-".to_owned();
    }
    let total = value.round() as u64;
    let (h, m, s) = (total / 3600, (total % 3600) / 60, total % 60);
    match (h, m, s) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, 0, _) => format!("{h}h"),
        (h, m, _) => format!("{h}h{m}m"),
    }
}

/// "the busiest owning b of the P partitions", where `replicas` consumers do not divide the
/// partitions evenly and the busiest one limits the group; `None` where they do.
pub fn busiest_owning(replicas: u32, partitions: u32) -> Option<String> {
    crate::drain::uneven_busiest_share(replicas, partitions)
        .map(|busiest| format!("the busiest owning {busiest} of the {partitions} partitions"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn si_suffixes() {
        assert_eq!(si(950.0), "950");
        assert_eq!(si(1500.0), "1.5k");
        assert_eq!(si(182_000.0), "182k");
        assert_eq!(si(2_340_000.0), "2.3M");
        assert_eq!(si(250.0), "250");
        assert_eq!(si(0.25), "0.2");
    }

    #[test]
    fn durations() {
        assert_eq!(seconds(0.0), "0s");
        assert_eq!(seconds(45.2), "45s");
        assert_eq!(seconds(250.0), "4m10s");
        assert_eq!(seconds(300.0), "5m");
        assert_eq!(seconds(7500.0), "2h5m");
        assert_eq!(seconds(f64::NAN), "-");
    }
}
