//! Which events of a Probing class a consumer processes.
//!
//! While a class is Probing, consumers process only `probeRatio` of its events to learn whether
//! the failure has healed without letting the whole class back in. The choice must be the same
//! in every replica, every process and every language, across restarts and redeliveries:
//! otherwise a redelivered event could be processed by one replica and skipped by another, and
//! the share actually processed would drift from the ratio. So it is a fixed function of the
//! event id, with no per-process randomness (no `RandomState`, no seeds).
//!
//! # Algorithm (normative; reimplement it exactly)
//!
//! 1. `digest = SHA-256(UTF-8 bytes of the event id)`, no normalization, no trimming.
//! 2. `h` = the first 8 bytes of `digest` read as an unsigned big-endian 64-bit integer.
//! 3. `position = (h >> 11) / 2^53`, a float in `[0, 1)` (exact: `h >> 11` has 53 bits, which
//!    an IEEE-754 double represents exactly).
//! 4. The event is a probe iff `position < probeRatio`.
//!
//! So ratio 0 selects nothing, ratio 1 selects everything, and an event selected at ratio `r`
//! is selected at every ratio above `r` (raising the ratio only adds probes).
//!
//! Reference implementations:
//!
//! ```text
//! Go:     sum := sha256.Sum256([]byte(id))
//!         h := binary.BigEndian.Uint64(sum[:8])
//!         probe := float64(h>>11)/(1<<53) < ratio
//! Java:   long h = ByteBuffer.wrap(MessageDigest.getInstance("SHA-256")
//!                     .digest(id.getBytes(StandardCharsets.UTF_8))).getLong();
//!         boolean probe = (h >>> 11) / 0x1p53 < ratio;
//! Python: h = int.from_bytes(hashlib.sha256(id.encode("utf-8")).digest()[:8], "big")
//!         probe = (h >> 11) / 2**53 < ratio
//! ```
//!
//! # Test vectors
//!
//! | event id                               | `h`                  | position  | 0.1 | 0.5 |
//! |----------------------------------------|----------------------|-----------|-----|-----|
//! | `""` (empty)                           | `0xe3b0c44298fc1c14` | 0.889416  | no  | no  |
//! | `evt-1`                                | `0x7b409f932d2c88e9` | 0.481455  | no  | yes |
//! | `evt-12`                               | `0x00f1f8d616beb21b` | 0.003692  | yes | yes |
//! | `order-1`                              | `0x0bafe22156d2698c` | 0.045653  | yes | yes |
//! | `order-42`                             | `0x3bf8b157c4238eef` | 0.234264  | no  | yes |
//! | `550e8400-e29b-41d4-a716-446655440000` | `0xa3a9e1ed9732cab2` | 0.639311  | no  | no  |
//! | `événement-7`                          | `0x4321c9d8359be120` | 0.262234  | no  | yes |
//!
//! SHA-256 rather than a faster non-cryptographic hash: every language ships it in its
//! standard library, so there is nothing to get subtly wrong, and its output is uniform even
//! for sequential ids such as `evt-1`, `evt-2`, where simple hashes like FNV-1a differ mostly in
//! their low bits. It runs once per event of a Probing class, which is cheap next to processing.

use sha2::{Digest, Sha256};

/// `h`: the first 8 bytes of SHA-256 of the event id's UTF-8 bytes, big-endian.
pub fn probe_hash(event_id: &str) -> u64 {
    let digest = Sha256::digest(event_id.as_bytes());
    let mut first_eight = [0_u8; 8];
    first_eight.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first_eight)
}

/// The event's fixed position in `[0, 1)`: `(h >> 11) / 2^53`.
pub fn probe_position(event_id: &str) -> f64 {
    const TWO_POW_53: f64 = (1_u64 << 53) as f64;
    (probe_hash(event_id) >> 11) as f64 / TWO_POW_53
}

/// Whether the event is one of the `probe_ratio` share of a Probing class that consumers
/// process: `probe_position(event_id) < probe_ratio`. A ratio of 0 (or below, or NaN) selects
/// nothing; 1 (or above) selects everything.
///
/// ```
/// use backlog_consumer::is_probe;
///
/// assert!(is_probe("order-1", 0.1));
/// assert!(!is_probe("order-42", 0.1));
/// assert!(is_probe("order-42", 0.5));
/// ```
pub fn is_probe(event_id: &str, probe_ratio: f64) -> bool {
    probe_position(event_id) < probe_ratio
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// (event id, h, selected at 0.1, selected at 0.5), computed independently with Python's
    /// hashlib.
    const VECTORS: [(&str, u64, bool, bool); 7] = [
        ("", 0xe3b0c44298fc1c14, false, false),
        ("evt-1", 0x7b409f932d2c88e9, false, true),
        ("evt-12", 0x00f1f8d616beb21b, true, true),
        ("order-1", 0x0bafe22156d2698c, true, true),
        ("order-42", 0x3bf8b157c4238eef, false, true),
        (
            "550e8400-e29b-41d4-a716-446655440000",
            0xa3a9e1ed9732cab2,
            false,
            false,
        ),
        ("événement-7", 0x4321c9d8359be120, false, true),
    ];

    #[test]
    fn test_vectors() {
        for (event_id, hash, at_tenth, at_half) in VECTORS {
            assert_eq!(probe_hash(event_id), hash, "{event_id:?}");
            assert_eq!(is_probe(event_id, 0.1), at_tenth, "{event_id:?} at 0.1");
            assert_eq!(is_probe(event_id, 0.5), at_half, "{event_id:?} at 0.5");
        }
        assert_eq!(probe_position("evt-12"), 0.0036921999624108803);
        assert_eq!(probe_position("order-1"), 0.045652516498032036);
    }

    #[test]
    fn degenerate_ratios() {
        for (event_id, ..) in VECTORS {
            assert!(!is_probe(event_id, 0.0));
            assert!(!is_probe(event_id, -1.0));
            assert!(!is_probe(event_id, f64::NAN));
            assert!(is_probe(event_id, 1.0));
        }
    }

    #[test]
    fn selected_share_is_close_to_the_ratio_for_sequential_ids() {
        let total = 20_000;
        for ratio in [0.01, 0.1, 0.5, 0.9] {
            let selected = (0..total)
                .filter(|n| is_probe(&format!("evt-{n}"), ratio))
                .count();
            let share = selected as f64 / total as f64;
            // Binomial standard deviation at 20k trials is at most 0.0036; allow ~4 sigma.
            assert!(
                (share - ratio).abs() < 0.015,
                "ratio {ratio}: share {share}"
            );
        }
    }

    proptest! {
        #[test]
        fn deterministic(event_id in ".*", ratio in 0.0f64..=1.0) {
            prop_assert_eq!(is_probe(&event_id, ratio), is_probe(&event_id.clone(), ratio));
            let position = probe_position(&event_id);
            prop_assert!((0.0..1.0).contains(&position));
        }

        #[test]
        fn ratio_zero_selects_none_and_one_selects_all(event_id in ".*") {
            prop_assert!(!is_probe(&event_id, 0.0));
            prop_assert!(is_probe(&event_id, 1.0));
        }

        #[test]
        fn monotone_in_the_ratio(event_id in ".*", low in 0.0f64..=1.0, high in 0.0f64..=1.0) {
            let (low, high) = if low <= high { (low, high) } else { (high, low) };
            if is_probe(&event_id, low) {
                prop_assert!(is_probe(&event_id, high));
            }
        }
    }

    proptest! {
        // Each case hashes thousands of ids; a few dozen cases are plenty.
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn share_over_random_ids_is_close_to_the_ratio(
            ids in prop::collection::hash_set("[a-zA-Z0-9-]{4,36}", 4000),
            ratio in 0.0f64..=1.0,
        ) {
            let selected = ids.iter().filter(|id| is_probe(id, ratio)).count();
            let share = selected as f64 / ids.len() as f64;
            // Standard deviation at 4000 ids is at most 0.008; allow ~6 sigma so the property
            // is about the function, not about luck.
            prop_assert!((share - ratio).abs() < 0.05, "ratio {}: share {}", ratio, share);
        }
    }
}
