use super::*;
use proptest::prelude::*;

const SHA: &str = "5e3c";

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(seconds).unwrap_or(Timestamp::UNIX_EPOCH)
}

fn facts() -> CompensationFacts {
    CompensationFacts {
        compensation_id: "refund-o-123".into(),
        claim: Claim::Ours { sha256: SHA.into() },
        approval: Ok("bob".into()),
        refused: Vec::new(),
        started_at: None,
        job_uid: None,
        uid_unrecorded: None,
        job: JobSeen::Absent,
        ended: None,
        now: at(1000),
    }
}

fn sub(name: &str, state: SubActionState) -> SubActionRecord {
    SubActionRecord {
        name: name.into(),
        operation_id: operation_id("refund-o-123", 0, name),
        state,
        started_at: None,
        finished_at: None,
        message: String::new(),
    }
}

fn report(held: bool, subs: Vec<SubActionRecord>) -> WorkerReport {
    WorkerReport {
        request_sha256: SHA.into(),
        precondition: PreconditionRecord {
            held,
            observed: "CAPTURED@7".into(),
            message: String::new(),
        },
        sub_actions: subs,
    }
}

/// The facts once the worker's Job ran to its end with `report`.
fn finished(report: Result<WorkerReport, ReportProblem>) -> CompensationFacts {
    let mut f = facts();
    f.started_at = Some(at(900));
    f.job_uid = Some("job-1".into());
    f.job = JobSeen::Ours {
        uid: "job-1".into(),
        suspended: false,
        outcome: JobEnd::Finished {
            succeeded: true,
            report,
        },
    };
    f
}

#[test]
fn names_and_operation_ids_are_stable() {
    assert_eq!(child_name("refund-o-123"), child_name("refund-o-123"));
    assert_ne!(child_name("refund-o-123"), child_name("refund-o-124"));
    assert!(child_name(&"x".repeat(5000)).len() <= 63);
    assert_eq!(operation_id("c-1", 2, "refund"), "c-1/2-refund");
}

#[test]
fn an_unclaimed_id_is_frozen_first() {
    let mut f = facts();
    f.claim = Claim::Free;
    let decision = decide(&f);
    assert_eq!(decision.phase, CompensationPhase::AwaitingApproval);
    assert_eq!(decision.action, Some(Action::Freeze));
}

#[test]
fn a_second_compensation_with_the_id_is_a_duplicate_of_the_first_and_its_result() {
    let mut f = facts();
    f.claim = Claim::Theirs {
        name: "refund-first".into(),
        result: Some((
            CompensationPhase::Succeeded,
            "2 sub-actions succeeded".into(),
        )),
    };
    let decision = decide(&f);
    assert_eq!(decision.phase, CompensationPhase::Duplicate);
    assert_eq!(decision.action, None);
    assert_eq!(decision.duplicate_of.as_deref(), Some("refund-first"));
    assert!(
        decision
            .message
            .contains("Succeeded: 2 sub-actions succeeded"),
        "{}",
        decision.message
    );
    // Once a duplicate, always one: it follows the first's result, and a claim that is gone
    // (its ConfigMap deleted) never lets it run.
    let mut later = f.clone();
    later.ended = Some((CompensationPhase::Duplicate, "before".into()));
    later.claim = Claim::Theirs {
        name: "refund-first".into(),
        result: None,
    };
    assert!(decide(&later).message.contains("has not ended yet"));
    later.claim = Claim::Free;
    let kept = decide(&later);
    assert_eq!(
        (kept.phase, kept.action, kept.message.as_str()),
        (CompensationPhase::Duplicate, None, "before")
    );
}

#[test]
fn nothing_starts_without_a_valid_approval_or_with_a_refused_template() {
    let mut f = facts();
    f.approval = Err(ApprovalProblem::Missing {
        requested_by: "alice".into(),
    });
    let waiting = decide(&f);
    assert_eq!(waiting.phase, CompensationPhase::AwaitingApproval);
    assert_eq!(waiting.action, None);
    let mut f = facts();
    f.refused = vec!["spec.template.spec.hostNetwork is true".into()];
    let refused = decide(&f);
    assert_eq!(refused.phase, CompensationPhase::Refused);
    assert!(refused.message.contains("hostNetwork"));
    assert_eq!(refused.action, None);
}

#[test]
fn an_approved_compensation_starts_once_and_resumes_its_own_job() {
    let f = facts();
    assert_eq!(decide(&f).action, Some(Action::Start));
    // Recorded as started, Job not there yet: created.
    let mut f = facts();
    f.started_at = Some(at(900));
    assert_eq!(decide(&f).action, Some(Action::Start));
    // Created by this process, uid not recorded: recorded and resumed.
    f.uid_unrecorded = Some("job-1".into());
    f.job = JobSeen::Ours {
        uid: "job-1".into(),
        suspended: true,
        outcome: JobEnd::Running,
    };
    assert_eq!(
        decide(&f).action,
        Some(Action::Resume {
            uid: "job-1".into()
        })
    );
    // Recorded and running: nothing to do.
    f.job_uid = Some("job-1".into());
    f.job = JobSeen::Ours {
        uid: "job-1".into(),
        suspended: false,
        outcome: JobEnd::Running,
    };
    let running = decide(&f);
    assert_eq!(
        (running.phase, running.action),
        (CompensationPhase::Executing, None)
    );
}

#[test]
fn a_recorded_job_that_vanished_or_was_replaced_is_unknown_and_never_recreated() {
    let mut f = facts();
    f.started_at = Some(at(900));
    f.job_uid = Some("job-1".into());
    let vanished = decide(&f);
    assert_eq!(vanished.phase, CompensationPhase::Unknown);
    assert_eq!(vanished.action, None);
    f.job = JobSeen::Foreign;
    assert_eq!(decide(&f).phase, CompensationPhase::Unknown);
    // A running Job of ours nobody recorded, not suspended: it may have done anything.
    let mut f = facts();
    f.started_at = Some(at(900));
    f.job = JobSeen::Ours {
        uid: "job-9".into(),
        suspended: false,
        outcome: JobEnd::Running,
    };
    assert_eq!(decide(&f).phase, CompensationPhase::Unknown);
}

#[test]
fn the_report_decides_the_end() {
    let ok = |state| sub("refund", state);
    let cases = [
        (
            report(
                true,
                vec![
                    ok(SubActionState::Succeeded),
                    sub("notify", SubActionState::Succeeded),
                ],
            ),
            CompensationPhase::Succeeded,
        ),
        (report(false, vec![]), CompensationPhase::PreconditionFailed),
        (
            report(false, vec![ok(SubActionState::Succeeded)]),
            CompensationPhase::Unknown,
        ),
        (
            report(
                true,
                vec![
                    ok(SubActionState::Succeeded),
                    sub("notify", SubActionState::Unknown),
                ],
            ),
            CompensationPhase::Unknown,
        ),
        (
            report(true, vec![ok(SubActionState::Started)]),
            CompensationPhase::Unknown,
        ),
        (
            report(true, vec![ok(SubActionState::Failed)]),
            CompensationPhase::Failed,
        ),
        (
            report(
                true,
                vec![
                    ok(SubActionState::Failed),
                    sub("notify", SubActionState::Unknown),
                ],
            ),
            CompensationPhase::Unknown,
        ),
        (report(true, vec![]), CompensationPhase::Failed),
    ];
    for (report, phase) in cases {
        let decision = decide(&finished(Ok(report.clone())));
        assert_eq!(decision.phase, phase, "{report:?}: {}", decision.message);
        assert_eq!(decision.action, None);
        assert_eq!(decision.report.as_ref(), Some(&report));
        let held = decision
            .conditions
            .iter()
            .find(|c| c.type_ == PRECONDITION_HELD)
            .unwrap();
        assert_eq!(held.status, Truth::from_bool(report.precondition.held));
    }
    let mut other = report(true, vec![sub("refund", SubActionState::Succeeded)]);
    other.request_sha256 = "ffff".into();
    assert_eq!(
        decide(&finished(Ok(other))).phase,
        CompensationPhase::Unknown
    );
    for problem in [
        ReportProblem::Missing,
        ReportProblem::Unreadable("x".into()),
    ] {
        assert_eq!(
            decide(&finished(Err(problem))).phase,
            CompensationPhase::Unknown
        );
    }
}

#[test]
fn reports_are_read_strictly() {
    let text = r#"{"requestSha256":"5e3c","precondition":{"held":true,"observed":"CAPTURED@7"},
        "subActions":[{"name":"refund","operationId":"c/0-refund","state":"Succeeded"}]}"#;
    let parsed = parse_report(text).expect("a report");
    assert_eq!(parsed.sub_actions[0].state, SubActionState::Succeeded);
    assert_eq!(parse_report("  "), Err(ReportProblem::Missing));
    assert!(matches!(
        parse_report("{\"requestSha256\":\"x\",\"precondition\":{\"held\":true},\"extra\":1}"),
        Err(ReportProblem::Unreadable(_))
    ));
    assert!(matches!(
        parse_report("done"),
        Err(ReportProblem::Unreadable(_))
    ));
}

#[test]
fn a_cut_report_is_named_as_cut() {
    // The kubelet keeps the last 4096 bytes of a longer message: no JSON, and the operator
    // says why, so the worker's author knows what to fix.
    let cut = format!("{}\"}}]}}", "x".repeat(REPORT_LIMIT - 4));
    assert_eq!(parse_report(&cut), Err(ReportProblem::Cut));
    assert!(ReportProblem::Cut.to_string().contains("4096-byte limit"));
    // Below the limit, unreadable stays unreadable.
    assert!(matches!(
        parse_report(&cut[1000..]),
        Err(ReportProblem::Unreadable(_))
    ));
}

/// The longest report of a success without the worker's words: every sub-action succeeded,
/// both timestamps at their longest RFC 3339 form, no messages, nothing observed.
fn longest_success_report(compensation_id: &str, names: &[&str]) -> String {
    let longest_time = "2026-12-07T21:23:59.123456789+01:00";
    let report = WorkerReport {
        request_sha256: "f".repeat(64),
        precondition: PreconditionRecord {
            held: true,
            observed: String::new(),
            message: String::new(),
        },
        sub_actions: names
            .iter()
            .enumerate()
            .map(|(index, name)| SubActionRecord {
                name: (*name).to_owned(),
                operation_id: operation_id(compensation_id, index, name),
                state: SubActionState::Succeeded,
                started_at: Some(longest_time.to_owned()),
                finished_at: Some(longest_time.to_owned()),
                message: String::new(),
            })
            .collect(),
    };
    serde_json::to_string(&report).expect("a report serializes")
}

proptest! {
    /// The admission rule's count is never below what the worker must write, and at most one
    /// byte per sub-action above it (the index counted with two digits), so a compensation
    /// it admits can report a success, and it refuses none that could by much.
    #[test]
    fn the_report_floor_bounds_a_success_report(
        compensation_id in "[a-z0-9]{1,253}",
        names in proptest::collection::vec("[a-z0-9]{1,63}", 1..=16),
    ) {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let written = longest_success_report(&compensation_id, &names).len();
        let counted = report_floor(&compensation_id, &names);
        prop_assert!(counted >= written, "counted {counted} < written {written}");
        prop_assert!(counted - written <= names.len().min(10), "counted {counted}, written {written}");
    }
}

fn arb_state() -> impl Strategy<Value = SubActionState> {
    prop_oneof![
        Just(SubActionState::Started),
        Just(SubActionState::Succeeded),
        Just(SubActionState::Failed),
        Just(SubActionState::Unknown),
    ]
}

fn arb_job() -> impl Strategy<Value = JobSeen> {
    let report =
        (any::<bool>(), proptest::collection::vec(arb_state(), 0..4)).prop_map(|(held, states)| {
            report(
                held,
                states
                    .into_iter()
                    .enumerate()
                    .map(|(i, s)| sub(&format!("s{i}"), s))
                    .collect(),
            )
        });
    let end = prop_oneof![
        Just(JobEnd::Running),
        (any::<bool>(), report).prop_map(|(succeeded, r)| JobEnd::Finished {
            succeeded,
            report: Ok(r)
        }),
        any::<bool>().prop_map(|succeeded| JobEnd::Finished {
            succeeded,
            report: Err(ReportProblem::Missing)
        }),
    ];
    prop_oneof![
        Just(JobSeen::Absent),
        Just(JobSeen::Foreign),
        (
            prop_oneof![Just("job-1"), Just("job-2")],
            any::<bool>(),
            end
        )
            .prop_map(|(uid, suspended, outcome)| JobSeen::Ours {
                uid: uid.into(),
                suspended,
                outcome
            }),
    ]
}

fn arb_facts() -> impl Strategy<Value = CompensationFacts> {
    let claim = prop_oneof![
        Just(Claim::Free),
        Just(Claim::Ours { sha256: SHA.into() }),
        Just(Claim::Theirs {
            name: "first".into(),
            result: None
        }),
    ];
    let approval = prop_oneof![
        Just(Ok("bob".to_owned())),
        Just(Err(ApprovalProblem::SelfApproved {
            approved_by: "alice".into()
        })),
    ];
    let uid = || {
        prop_oneof![
            Just(None),
            Just(Some("job-1".to_owned())),
            Just(Some("job-2".to_owned()))
        ]
    };
    (
        claim,
        approval,
        any::<bool>(),
        any::<bool>(),
        uid(),
        uid(),
        arb_job(),
    )
        .prop_map(
            |(claim, approval, refused, started, job_uid, uid_unrecorded, job)| {
                let mut f = facts();
                f.claim = claim;
                f.approval = approval;
                if refused {
                    f.refused = vec!["spec.template.spec.hostPID is true".into()];
                }
                f.started_at = started.then(|| at(900));
                f.job_uid = if started { job_uid } else { None };
                f.uid_unrecorded = if started { uid_unrecorded } else { None };
                f.job = if started { job } else { JobSeen::Absent };
                f
            },
        )
}

proptest! {
    /// The promises a compensation keeps whatever the facts: a Job is created only for the
    /// claim holder with a valid approval and an accepted template, and never again once the
    /// status records one; a duplicate never runs; a terminal end stays.
    #[test]
    fn the_machine_keeps_its_promises(f in arb_facts()) {
        let decision = decide(&f);
        if matches!(decision.action, Some(Action::Start) | Some(Action::Resume { .. })) {
            let holds_claim = matches!(f.claim, Claim::Ours { .. });
            prop_assert!(holds_claim);
            prop_assert!(f.approval.is_ok() || f.started_at.is_some());
        }
        if decision.action == Some(Action::Start) {
            prop_assert!(f.job_uid.is_none(), "a recorded Job is never created again");
            prop_assert!(f.started_at.is_some() || f.refused.is_empty());
        }
        if let Claim::Theirs { .. } = f.claim {
            prop_assert_eq!(decision.phase, CompensationPhase::Duplicate);
            prop_assert_eq!(decision.action.clone(), None);
        }
        if decision.phase.terminal() {
            prop_assert_eq!(decision.action.clone(), None);
            let mut later = f.clone();
            later.ended = Some((decision.phase, decision.message.clone()));
            later.approval = Ok("carol".into());
            later.refused.clear();
            later.job = JobSeen::Absent;
            later.job_uid = None;
            let again = decide(&later);
            prop_assert_eq!(again.phase, decision.phase);
            prop_assert_eq!(again.action, None);
        }
    }
}
