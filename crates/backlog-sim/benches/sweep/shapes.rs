//! Random load shapes for the sweep bench: each a sample of a class (steady, a step, one
//! spike, periodic peaks, a ramp, a stall then a flood, irregular spikes, a slowdown), with
//! the workload and the budget's settings drawn at random.

/// xorshift64: the same scenarios on every machine, without a dependency for it.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn range(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * self.unit()
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[(self.next() % items.len() as u64) as usize]
    }
}

pub const SHAPES: [&str; 8] = [
    "steady",
    "step",
    "spike",
    "periodic",
    "ramp",
    "stall-flood",
    "spikes",
    "slowdown",
];

/// Scenario `index` of a sweep as YAML (the format of examples/scenarios/), with its name.
/// The shape cycles through [`SHAPES`]; everything else is drawn: partitions, per-replica
/// rate, the cap (a quarter below the partition count), the load as a share of what the cap
/// completes, the deadline and drain target, pod start, rebalance, stabilization, and a
/// configured rate that is right, wrong (×0.5–2) or absent.
pub fn scenario(rng: &mut Rng, index: usize) -> (String, String) {
    let shape = SHAPES[index % SHAPES.len()];
    let partitions = rng.pick(&[4u32, 8, 12, 16, 24, 32, 48, 64]);
    let rate = rng.range(50.0, 800.0).round();
    let max_replicas = if rng.next().is_multiple_of(4) {
        (partitions / 2).max(2)
    } else {
        partitions * 2
    };
    // What the most replicas complete (arrivals spread over the partitions).
    let most = max_replicas.min(partitions);
    let cap = partitions as f64 / partitions.div_ceil(most) as f64 * rate;
    let base = (cap * rng.range(0.05, 0.6)).round();
    let duration = rng.pick(&[60.0, 90.0, 120.0]) * 60.0;
    let deadline = rng.pick(&[120.0, 300.0, 600.0, 900.0, 1800.0]);
    let drain = (deadline * rng.range(0.25, 1.0)).round();
    let pod_start = rng.range(5.0, 90.0).round();
    let rebalance = rng.range(0.0, 40.0).round();
    let stabilization = rng.pick(&[60.0, 180.0, 300.0]);
    let mut production = vec![format!("  - {{from: 0s, rate: {base}}}")];
    let mut slowdowns = Vec::new();
    let height = |rng: &mut Rng| (base * rng.range(1.5, 8.0)).min(cap * 1.5).round();
    match shape {
        "steady" => {}
        "step" => {
            let at = rng.range(0.2, 0.6) * duration;
            let to = (base * rng.range(0.3, 3.0)).min(cap * 0.95).round();
            production.push(format!("  - {{from: {at:.0}s, rate: {to}}}"));
        }
        "spike" => {
            let at = rng.range(0.2, 0.7) * duration;
            let len = rng.range(20.0, 600.0);
            production.push(format!("  - {{from: {at:.0}s, rate: {}}}", height(rng)));
            production.push(format!("  - {{from: {:.0}s, rate: {base}}}", at + len));
        }
        "periodic" => {
            let period = rng.range(120.0, 1200.0);
            let duty = rng.range(0.2, 0.8);
            let high = height(rng);
            let mut t = rng.range(0.0, period);
            while t < duration {
                production.push(format!("  - {{from: {t:.0}s, rate: {high}}}"));
                production.push(format!(
                    "  - {{from: {:.0}s, rate: {base}}}",
                    t + duty * period
                ));
                t += period;
            }
        }
        "ramp" => {
            let at = rng.range(0.1, 0.4) * duration;
            let len = rng.range(300.0, 1800.0);
            let high = height(rng).min(cap * 0.9);
            production.push(format!(
                "  - {{from: {at:.0}s, rate: {base}, rampTo: {high}}}"
            ));
            production.push(format!(
                "  - {{from: {:.0}s, rate: {high}, rampTo: {base}}}",
                at + len
            ));
            production.push(format!(
                "  - {{from: {:.0}s, rate: {base}}}",
                at + 2.0 * len
            ));
        }
        "stall-flood" => {
            let at = rng.range(0.15, 0.5) * duration;
            let stall = rng.range(60.0, 900.0);
            let factor = rng.range(2.0, 5.0);
            let flood = stall / (factor - 1.0);
            production.push(format!("  - {{from: {at:.0}s, rate: 0}}"));
            production.push(format!(
                "  - {{from: {:.0}s, rate: {}}}",
                at + stall,
                (base * factor).round()
            ));
            production.push(format!(
                "  - {{from: {:.0}s, rate: {base}}}",
                at + stall + flood
            ));
        }
        "spikes" => {
            let mut t = rng.range(120.0, 900.0);
            while t < duration {
                let len = rng.range(15.0, 240.0);
                production.push(format!("  - {{from: {t:.0}s, rate: {}}}", height(rng)));
                production.push(format!("  - {{from: {:.0}s, rate: {base}}}", t + len));
                t += len + rng.range(120.0, 1500.0);
            }
        }
        _ => {
            let at = rng.range(0.1, 0.5) * duration;
            let len = rng.range(300.0, 2400.0);
            let factor = rng.range(0.4, 0.9);
            slowdowns.push(format!(
                "    - {{from: {at:.0}s, to: {:.0}s, factor: {factor:.2}}}",
                at + len
            ));
        }
    }
    let prior = match rng.next() % 4 {
        0 => String::new(),
        1 => format!(
            "  capacity: {{perReplicaRate: {:.0}, reservedRetryShare: 0}}\n",
            rate * rng.range(0.5, 2.0)
        ),
        _ => format!("  capacity: {{perReplicaRate: {rate}, reservedRetryShare: 0}}\n"),
    };
    let initial = ((base / rate).ceil() as u32).clamp(1, max_replicas);
    let name = format!("{shape}-{index}");
    let yaml = format!(
        "name: {name}\nduration: {duration:.0}s\npartitions: {partitions}\ninitialReplicas: {initial}\n\
         podStartDelay: {pod_start}s\nrebalancePause: {rebalance}s\nproduction:\n{}\nconsumer:\n  perReplicaRate: {rate}\n{}\
         budget:\n  minReplicas: 1\n  maxReplicas: {max_replicas}\n  completionDeadline: {deadline}s\n{prior}  scaling: {{targetDrainTime: {drain}s, scaleDownStabilization: {stabilization}s, rebalanceCost: {rebalance}s}}\n",
        production.join("\n"),
        if slowdowns.is_empty() {
            String::new()
        } else {
            format!("  slowdowns:\n{}\n", slowdowns.join("\n"))
        },
    );
    (name, yaml)
}
