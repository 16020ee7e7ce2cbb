//! Deployment gates in the scheduler: a declared limit shared by partitions, paced drains, and
//! a registry change that raises a limit.

use super::*;
use crate::gates::{DeploymentLimits, Gate};
use crate::pacing::{PacingConfig, Signal};

fn key(service: &str, object: Option<&str>) -> QueueKey {
    QueueKey {
        scope: None,
        limit_key: None,
        service: service.into(),
        object_key: object.map(Into::into),
        priority: Default::default(),
    }
}

/// Two partitions' schedulers over one set of gates and one invoker.
fn pair(gates: &Arc<Gates>) -> (Scheduler, Scheduler) {
    let slots = Arc::new(InvokerSlots::new(100));
    let book = Arc::new(RuleBook::new());
    let a =
        Scheduler::sharing(Arc::clone(&book), Arc::clone(&slots), 0).with_gates(Arc::clone(gates));
    let b = Scheduler::sharing(book, slots, 1).with_gates(Arc::clone(gates));
    (a, b)
}

fn blocked_on(s: &Scheduler, key: &QueueKey) -> Option<BlockedOn> {
    s.queues()
        .into_iter()
        .find(|q| &q.key == key)
        .and_then(|q| q.blocked_on)
}

#[test]
fn a_declared_limit_holds_across_partitions_and_wakes_the_other_one() {
    let gates = Arc::new(Gates::new(PacingConfig::default()));
    gates.sync(&[DeploymentLimits::of(
        "dp_1",
        Some(2),
        &[("S", None), ("T", Some(1))],
    )]);
    let (mut a, mut b) = pair(&gates);
    let k = key("S", None);
    for id in 1..=3 {
        a.enqueue(&k, id, EntryKind::New, None, 0);
    }
    for id in 11..=12 {
        b.enqueue(&k, id, EntryKind::New, None, 0);
    }
    let mut running = a.poll_runnable(0);
    assert_eq!(running.len(), 2, "the deployment declares 2");
    assert!(b.poll_runnable(0).is_empty());
    match blocked_on(&b, &k) {
        Some(BlockedOn::DeploymentConcurrency {
            gate,
            limit,
            running,
            closed_until_ms,
        }) => {
            assert_eq!(
                (gate.as_str(), limit, running, closed_until_ms),
                ("dp_1", Some(2), 2, None)
            );
        }
        other => panic!("blocked on {other:?}"),
    }
    a.release(running.pop().unwrap().permit, 1);
    let nudged = a.take_nudges();
    assert!(
        Gate::names(nudged, 1),
        "b waits at the gate a gave a slot back to"
    );
    let woken = b.poll_runnable(1);
    assert_eq!(woken.len(), 1);
    // A service with its own limit counts against both.
    let t = key("T", None);
    b.enqueue(&t, 21, EntryKind::New, None, 1);
    assert!(
        b.poll_runnable(1).is_empty(),
        "the deployment's 2 are taken"
    );
    a.release(running.pop().unwrap().permit, 2);
    let mut b_running = b.poll_runnable(2);
    assert_eq!(
        ids(&b_running),
        vec![12],
        "in the order they parked at the gate"
    );
    b.release(woken.into_iter().next().unwrap().permit, 3);
    let t_running = b.poll_runnable(3);
    assert_eq!(ids(&t_running), vec![21]);
    b.enqueue(&t, 22, EntryKind::New, None, 3);
    b.release(b_running.pop().unwrap().permit, 4);
    // The deployment has room again; the service's own 1 is taken.
    assert!(b.poll_runnable(4).is_empty());
    assert!(matches!(
        blocked_on(&b, &t),
        Some(BlockedOn::DeploymentConcurrency { ref gate, .. }) if gate == "dp_1/T"
    ));
    for d in t_running {
        b.release(d.permit, 5);
    }
    assert_eq!(ids(&b.poll_runnable(5)), vec![22]);
}

#[test]
fn an_outage_paces_the_backlog_and_successes_open_it_again() {
    let gates = Arc::new(Gates::new(PacingConfig {
        enabled: true,
        initial_window: 2,
        open_window: 8,
        max_closed_ms: 60_000,
        max_probe_ms: 2_000,
    }));
    gates.sync(&[DeploymentLimits::of("dp_1", None, &[("S", None)])]);
    let (mut s, _) = pair(&gates);
    let k = key("S", None);
    for id in 1..=50 {
        s.enqueue(&k, id, EntryKind::New, None, 0);
    }
    let first = s.poll_runnable(0);
    assert_eq!(first.len(), 50, "not paced: all at once");
    // The deployment is down: every attempt fails and comes back.
    for d in &first {
        s.report(&d.permit, Signal::Down, 1);
    }
    for d in first {
        s.release(d.permit, 1);
        s.enqueue(&k, d.entry, EntryKind::Resumed, None, 1);
    }
    assert!(
        s.poll_runnable(2).is_empty(),
        "the first probes wait 100 ms"
    );
    assert_eq!(s.next_timer(), Some(101));
    let mut running = s.poll_runnable(101);
    assert_eq!(running.len(), 2, "the drain starts from the initial window");
    assert!(matches!(
        blocked_on(&s, &k),
        Some(BlockedOn::DeploymentConcurrency { limit: Some(2), .. })
    ));
    // Up again: each success lets one more through, and more at once as the window grows.
    let gate = gates.for_service("S").deployment.unwrap();
    let (mut peak, mut windows) = (0, Vec::new());
    let mut now = 102;
    while !running.is_empty() {
        if let Some(limit) = gate.limit() {
            peak = peak.max(running.len());
            assert!(
                running.len() <= limit as usize + 1,
                "{} ran in a window of {limit}",
                running.len()
            );
            windows.push(limit);
        }
        let done = running.remove(0);
        s.report(&done.permit, Signal::Answered, now);
        s.release(done.permit, now);
        running.extend(s.poll_runnable(now));
        now += 1;
    }
    assert!(
        peak > 2 && peak <= 8,
        "paced from 2 towards the open window: {peak}"
    );
    assert!(
        windows.windows(2).all(|w| w[0] <= w[1]),
        "only grew: {windows:?}"
    );
    assert_eq!(gate.limit(), None, "open again");
}

#[test]
fn retry_after_closes_the_gate_until_then() {
    let gates = Arc::new(Gates::new(PacingConfig::default()));
    gates.sync(&[DeploymentLimits::of("dp_1", None, &[("S", None)])]);
    let (mut s, _) = pair(&gates);
    let k = key("S", None);
    s.enqueue(&k, 1, EntryKind::New, None, 0);
    let d = s.poll_runnable(0).pop().unwrap();
    s.report(
        &d.permit,
        Signal::Overloaded {
            retry_after_ms: Some(5_000),
        },
        10,
    );
    s.release(d.permit, 10);
    s.enqueue(&k, 1, EntryKind::Resumed, None, 10);
    assert!(s.poll_runnable(10).is_empty());
    assert_eq!(
        s.next_timer(),
        Some(5_010),
        "the partition polls when the gate opens"
    );
    assert!(matches!(
        blocked_on(&s, &k),
        Some(BlockedOn::DeploymentConcurrency {
            closed_until_ms: Some(5_010),
            ..
        })
    ));
    assert_eq!(ids(&s.poll_runnable(5_010)), vec![1]);
}

#[test]
fn a_registry_change_moves_queues_to_the_new_gates_and_wakes_them() {
    let gates = Arc::new(Gates::new(PacingConfig {
        enabled: false,
        ..PacingConfig::default()
    }));
    gates.sync(&[DeploymentLimits::of("dp_1", Some(1), &[("S", None)])]);
    let (mut s, _) = pair(&gates);
    let k = key("S", None);
    for id in 1..=3 {
        s.enqueue(&k, id, EntryKind::New, None, 0);
    }
    let first = s.poll_runnable(0);
    assert_eq!(first.len(), 1);
    // A new deployment of S with no limit: the waiting ones run there.
    gates.sync(&[DeploymentLimits::of("dp_2", None, &[("S", None)])]);
    assert_eq!(ids(&s.poll_runnable(1)), vec![2, 3]);
    // The old gate's slot still goes back to it; nothing is left behind.
    for d in first {
        s.release(d.permit, 2);
    }
    assert!(s.gates.live() <= 1);
}

fn ids(dispatches: &[Dispatch]) -> Vec<EntryId> {
    dispatches.iter().map(|d| d.entry).collect()
}

mod shared {
    //! Two partitions over one deployment gate, driven the way the runtime drives them: the
    //! one an event reaches polls, and every partition a give-back names is nudged to poll,
    //! until nobody is named. Then, whatever happened, the gate counts exactly what runs and
    //! nothing waits while it has room (no wake-up lost between partitions).

    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        /// An entry arrives at partition `.0` with priority class `.1`.
        Arrive(usize, u8),
        /// Partition `.0`'s `.1`-th running attempt ends.
        End(usize, usize),
        /// The deployment declares a new limit.
        Declare(u32),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0..2usize, 0..3u8).prop_map(|(p, c)| Step::Arrive(p, c)),
            4 => (0..2usize, any::<usize>()).prop_map(|(p, i)| Step::End(p, i)),
            1 => (1..5u32).prop_map(Step::Declare),
        ]
    }

    fn key(class: u8) -> QueueKey {
        QueueKey {
            priority: crate::priority::Priority::try_from(class * 4).unwrap(),
            ..super::key("S", None)
        }
    }

    proptest! {
        #[test]
        fn no_wake_up_is_lost_between_partitions(steps in prop::collection::vec(step(), 1..300)) {
            let gates = Arc::new(Gates::new(PacingConfig { enabled: false, ..PacingConfig::default() }));
            gates.sync(&[DeploymentLimits::of("dp", Some(2), &[("S", None)])]);
            let (a, b) = pair(&gates);
            let mut parts = [a, b];
            let mut running: [Vec<Dispatch>; 2] = [Vec::new(), Vec::new()];
            let mut next = 0;
            for (now, step) in steps.into_iter().enumerate() {
                let now = now as u64;
                let first = match step {
                    Step::Arrive(p, class) => {
                        next += 1;
                        parts[p].enqueue(&key(class), next, EntryKind::New, None, now);
                        p
                    }
                    Step::End(p, i) => {
                        if running[p].is_empty() {
                            continue;
                        }
                        let done = running[p].remove(i % running[p].len());
                        parts[p].release(done.permit, now);
                        p
                    }
                    Step::Declare(limit) => {
                        gates.sync(&[DeploymentLimits::of("dp", Some(limit), &[("S", None)])]);
                        // The registry nudges every partition after a change.
                        0
                    }
                };
                let mut to_poll: Vec<usize> = match step {
                    Step::Declare(_) => vec![0, 1],
                    _ => vec![first],
                };
                let mut rounds = 0;
                while let Some(p) = to_poll.pop() {
                    rounds += 1;
                    prop_assert!(rounds < 100, "nudges never settle");
                    running[p].extend(parts[p].poll_runnable(now));
                    let nudged = parts[p].take_nudges();
                    for other in 0..2 {
                        if other != p && Gate::names(nudged, other as u32) && !to_poll.contains(&other) {
                            to_poll.push(other);
                        }
                    }
                }
                let gate = gates.for_service("S").deployment.unwrap();
                let runs = (running[0].len() + running[1].len()) as u32;
                prop_assert_eq!(gate.used(), runs, "the gate counts what runs");
                let waiting: usize = parts.iter().flat_map(|p| p.queues()).map(|q| q.queued).sum();
                if gate.limit().is_some_and(|l| runs < l) {
                    prop_assert_eq!(waiting, 0, "{} wait while the gate has room ({} of {:?})", waiting, runs, gate.limit());
                }
            }
        }
    }
}
