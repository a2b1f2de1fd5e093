use super::*;
use proptest::prelude::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn timing() -> Timing {
    Timing::new(ms(4000), ms(2500), ms(500)).unwrap()
}

fn me() -> Identity {
    Identity::new(Some("operator-0")).unwrap()
}

fn held_by(holder: &str, renewed: i64) -> LeaseRecord {
    LeaseRecord {
        holder: Some(holder.to_owned()),
        duration_seconds: Some(4),
        acquire_time: Some(Timestamp::from_second(0).unwrap()),
        renew_time: Some(Timestamp::from_second(renewed).unwrap()),
        transitions: Some(0),
    }
}

#[test]
fn timing_keeps_the_renew_deadline_below_the_lease() {
    assert!(Timing::new(ms(15_000), ms(10_000), ms(2_000)).is_ok());
    assert!(matches!(
        Timing::new(ms(4000), ms(4000), ms(500)),
        Err(TimingError::RenewDeadlineNotBelowLease { .. })
    ));
    assert!(matches!(
        Timing::new(ms(4000), ms(2500), ms(2500)),
        Err(TimingError::RetryPeriodNotBelowRenewDeadline { .. })
    ));
    assert!(matches!(
        Timing::new(ms(4000), ms(2500), ms(0)),
        Err(TimingError::RetryPeriodNotBelowRenewDeadline { .. })
    ));
    assert!(matches!(
        Timing::new(ms(4500), ms(2500), ms(500)),
        Err(TimingError::LeaseNotWholeSeconds(_))
    ));
    assert!(matches!(
        Timing::new(ms(0), ms(0), ms(0)),
        Err(TimingError::LeaseNotWholeSeconds(_))
    ));
    let message = Timing::new(ms(4000), ms(5000), ms(500))
        .unwrap_err()
        .to_string();
    assert!(message.contains("--lease-renew-deadline"), "{message}");
}

#[test]
fn an_identity_is_required_and_printable() {
    assert_eq!(Identity::new(None), Err(IdentityError::Missing));
    assert_eq!(Identity::new(Some("  ")), Err(IdentityError::Missing));
    assert!(matches!(
        Identity::new(Some("a b")),
        Err(IdentityError::Unusable(_))
    ));
    assert!(matches!(
        Identity::new(Some(&"x".repeat(254))),
        Err(IdentityError::Unusable(_))
    ));
    assert_eq!(
        Identity::new(Some(" backlog-operator-7d9f-abcde "))
            .unwrap()
            .as_str(),
        "backlog-operator-7d9f-abcde"
    );
    assert!(IdentityError::Missing.to_string().contains("POD_NAME"));
}

#[test]
fn the_time_of_change_moves_only_when_the_record_changes() {
    let t0 = Instant::now();
    let first = observe(None, held_by("other", 100), t0);
    assert_eq!(first.changed_at, t0);
    let same = observe(Some(&first), held_by("other", 100), t0 + ms(1000));
    assert_eq!(same.changed_at, t0);
    let renewed = observe(Some(&same), held_by("other", 101), t0 + ms(2000));
    assert_eq!(renewed.changed_at, t0 + ms(2000));
}

#[test]
fn a_standby_waits_a_whole_lease_from_the_last_change_it_saw() {
    let t0 = Instant::now();
    let timing = timing();
    assert_eq!(candidacy(None, &me(), &timing, t0), Candidacy::Create);
    // The holder's time stamps say nothing: renewed "in 1970" or "next year" alike.
    for renewed in [0, 4_000_000_000] {
        let seen = observe(None, held_by("other", renewed), t0);
        assert_eq!(
            candidacy(Some(&seen), &me(), &timing, t0 + ms(3999)),
            Candidacy::Wait {
                expires_at: t0 + ms(4000)
            }
        );
        assert_eq!(
            candidacy(Some(&seen), &me(), &timing, t0 + ms(4000)),
            Candidacy::TakeOver
        );
    }
}

#[test]
fn a_free_or_own_lease_is_taken_at_once() {
    let t0 = Instant::now();
    let timing = timing();
    for record in [
        LeaseRecord::default(),
        held_by("", 0),
        held_by("operator-0", 0),
        held_by("other", 0).released(Timestamp::from_second(5).unwrap()),
    ] {
        let seen = observe(None, record, t0);
        assert_eq!(
            candidacy(Some(&seen), &me(), &timing, t0),
            Candidacy::TakeOver
        );
    }
}

#[test]
fn a_lease_without_a_usable_duration_counts_as_ours() {
    let t0 = Instant::now();
    let timing = timing();
    for duration in [None, Some(0), Some(-5)] {
        let record = LeaseRecord {
            duration_seconds: duration,
            ..held_by("other", 0)
        };
        let seen = observe(None, record, t0);
        assert_eq!(
            candidacy(Some(&seen), &me(), &timing, t0 + ms(3999)),
            Candidacy::Wait {
                expires_at: t0 + ms(4000)
            }
        );
    }
}

#[test]
fn a_leader_renews_until_its_renew_deadline_then_steps_down() {
    let t0 = Instant::now();
    let timing = timing();
    assert_eq!(
        renewal(t0, &timing, t0 + ms(500)),
        Renewal::Renew {
            call_deadline: t0 + ms(2500)
        }
    );
    assert_eq!(renewal(t0, &timing, t0 + ms(2500)), Renewal::StepDown);
    assert_eq!(timing.leads_until(t0), t0 + ms(2500));
}

#[test]
fn records_written_count_transitions_and_release_frees_the_lease() {
    let timing = timing();
    let now = Timestamp::from_second(10).unwrap();
    let taken = held_by("other", 5).taken_over_by(&me(), &timing, now);
    assert_eq!(taken.holder.as_deref(), Some("operator-0"));
    assert_eq!(taken.transitions, Some(1));
    assert_eq!(taken.duration_seconds, Some(4));
    assert_eq!(taken.acquire_time, Some(now));
    // Creating, or taking back our own lease, is no transition.
    assert_eq!(
        LeaseRecord::default()
            .taken_over_by(&me(), &timing, now)
            .transitions,
        Some(0)
    );
    assert_eq!(
        held_by("operator-0", 5)
            .taken_over_by(&me(), &timing, now)
            .transitions,
        Some(0)
    );
    let renewed = taken.renewed(&me(), &timing, Timestamp::from_second(11).unwrap());
    assert_eq!(renewed.acquire_time, Some(now));
    assert_eq!(renewed.transitions, Some(1));
    let released = renewed.released(Timestamp::from_second(12).unwrap());
    assert_eq!(released.holder, None);
    assert_eq!(released.transitions, Some(1));
    assert!(still_ours(&renewed, &me()));
    assert!(!still_ours(&released, &me()));
}

/// One renewal of the leader in a simulated run (milliseconds of real time).
#[derive(Clone, Debug)]
struct Attempt {
    /// Time since the previous attempt was sent.
    gap: u64,
    /// From send to the write landing in the Lease (if it lands at all).
    write_delay: u64,
    lands: bool,
}

/// One read of the standby: when it asks, and how long the answer takes to arrive.
#[derive(Clone, Debug)]
struct Read {
    gap: u64,
    delay: u64,
}

fn attempts() -> impl Strategy<Value = Vec<Attempt>> {
    prop::collection::vec(
        (1u64..3000, 0u64..3000, prop::bool::weighted(0.7)).prop_map(
            |(gap, write_delay, lands)| Attempt {
                gap,
                write_delay,
                lands,
            },
        ),
        1..40,
    )
}

fn reads() -> impl Strategy<Value = Vec<Read>> {
    prop::collection::vec(
        (1u64..1500, 0u64..2000).prop_map(|(gap, delay)| Read { gap, delay }),
        1..80,
    )
}

proptest! {
    /// The safety of the whole scheme: whatever the delays, lost writes and pauses, and with
    /// the standby's clock running up to `lease / renew_deadline` times faster than the
    /// leader's, a standby decides to take over only after the leader's last term has ended.
    #[test]
    fn a_standby_never_takes_over_while_the_leader_may_write(
        attempts in attempts(),
        reads in reads(),
        drift_permille in 1000u64..1590,
    ) {
        let timing = timing();
        let base = Instant::now();
        // The leader's renewals that landed: (sent at, written at), in real milliseconds. A
        // renewal only counts if it was sent within the term of the previous one.
        let mut landed: Vec<(u64, u64)> = vec![(0, 0)];
        let mut sent = 0u64;
        for attempt in &attempts {
            sent += attempt.gap;
            let term_end = landed.last().map_or(0, |(s, _)| s + 2500);
            if sent >= term_end {
                break;
            }
            if attempt.lands {
                let written = sent + attempt.write_delay.min(term_end - sent - 1);
                if landed.last().is_none_or(|(_, w)| written > *w) {
                    landed.push((sent, written));
                }
            }
        }
        // The standby reads the Lease; its clock runs `drift` times as fast as real time.
        let local = |real: u64| base + Duration::from_millis(real * drift_permille / 1000);
        let version_at = |t: u64| landed.iter().rposition(|(_, w)| *w <= t).unwrap_or(0);
        let mut observed: Option<Observed> = None;
        let mut asked = 0u64;
        for read in &reads {
            asked += read.gap;
            let answered = asked + read.delay;
            // The answer shows the Lease as it was when the server read it.
            let version = version_at(asked);
            let record = held_by("leader", i64::try_from(version).unwrap());
            observed = Some(observe(observed.as_ref(), record, local(answered)));
            let decision = candidacy(observed.as_ref(), &me(), &timing, local(answered));
            // The takeover is written on the version read: it lands only if the leader has not
            // renewed since, and then the leader's later renewals are the ones refused.
            if decision == Candidacy::TakeOver && version_at(answered) == version {
                let leader_stops = landed[version].0 + 2500;
                prop_assert!(
                    answered >= leader_stops,
                    "took over at {answered} ms, the leader writes until {leader_stops} ms"
                );
                break;
            }
        }
    }

    /// A leader never renews after its term; the call it makes ends with the term.
    #[test]
    fn a_renewal_never_outlives_the_term(sent in 0u64..100_000, now in 0u64..100_000) {
        let timing = timing();
        let base = Instant::now();
        match renewal(base + ms(sent), &timing, base + ms(now)) {
            Renewal::Renew { call_deadline } => {
                prop_assert!(now < sent + 2500);
                prop_assert_eq!(call_deadline, base + ms(sent + 2500));
            }
            Renewal::StepDown => prop_assert!(now >= sent + 2500),
        }
    }
}
