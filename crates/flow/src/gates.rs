//! Deployment gates: one more level every attempt on a deployment counts against, shared by
//! every partition's scheduler like the invoker's slots.
//!
//! A gate's size is the concurrency limit the deployment (or one of its services) declares in
//! its discovery manifest, capped by the deployment's paced-drain window while it recovers
//! from an outage ([`crate::pacing`]). Taking a slot is one compare-and-swap; a partition that
//! finds the gate full raises its bit in `waiting`, and whoever gives a slot back (or grows the
//! window) collects the bits, so nobody polls.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::pacing::{Pacer, PacingConfig, Signal};

/// Bits of `waiting` a partition index maps to (more partitions share bits: a spurious nudge
/// only costs a poll).
const MEMBERS: u32 = u64::BITS;

/// No limit.
const UNLIMITED: u32 = u32::MAX;

/// Which of a cluster's partitions this node leads (`None`: all of them, as embedded). A gate
/// lets this node run its part of the gate's limit: partition *p* of *n* carries
/// `⌊L·(p+1)/n⌋ − ⌊L·p/n⌋` of limit *L* (the parts add up to *L*), and a node runs what its
/// partitions carry, at least 1 while it leads any (so no partition's work waits for good). The
/// nodes together stay within *L* whenever *L* is at least the number of nodes leading
/// partitions; below that each runs 1.
#[derive(Debug, Default)]
pub struct Share {
    led: RwLock<Option<Vec<bool>>>,
}

impl Share {
    /// This node's part of `limit`.
    pub fn of(&self, limit: u32) -> u32 {
        if limit == UNLIMITED {
            return UNLIMITED;
        }
        let led = self.led.read().unwrap_or_else(|e| e.into_inner());
        let Some(led) = led.as_ref().filter(|led| !led.is_empty()) else {
            return limit;
        };
        let (whole, n) = (u64::from(limit), led.len() as u64);
        let part: u64 = (0..n)
            .filter(|p| led[*p as usize])
            .map(|p| whole * (p + 1) / n - whole * p / n)
            .sum();
        let part = u32::try_from(part).unwrap_or(limit);
        if part == 0 && led.contains(&true) {
            1
        } else {
            part
        }
    }
}

/// One gate: a deployment's, or one service's of a deployment.
#[derive(Debug)]
pub struct Gate {
    id: u64,
    name: Box<str>,
    /// The declared limit (`UNLIMITED`: none).
    declared: AtomicU32,
    /// What may run now: the declared limit, capped by the pacing window.
    limit: AtomicU32,
    used: AtomicU32,
    waiting: AtomicU64,
    /// New attempts wait until then (ms): a `Retry-After` the deployment answered.
    closed_until: AtomicU64,
    /// Deployment gates pace; service gates only bound.
    pacer: Option<Mutex<Pacer>>,
    /// The pacer has a window: successes count.
    paced: AtomicBool,
    /// This node's part of the limit (cluster mode).
    share: Arc<Share>,
}

/// A gate as operators see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateSnapshot {
    /// The deployment id, or `deployment/service`.
    pub name: String,
    /// The limit its manifest declares.
    pub declared: Option<u32>,
    /// The paced-drain window, while it recovers.
    pub window: Option<u32>,
    /// What may run through it now: the declared limit, capped by the window.
    pub limit: Option<u32>,
    /// Attempts running through it (on this node).
    pub used: u32,
    /// New attempts wait until then (ms since the epoch), after a `Retry-After`.
    pub closed_until_ms: Option<u64>,
}

impl Gate {
    fn new(
        id: u64,
        name: &str,
        declared: Option<u32>,
        pacing: Option<PacingConfig>,
        share: Arc<Share>,
    ) -> Self {
        let declared = declared.unwrap_or(UNLIMITED);
        Self {
            id,
            name: name.into(),
            declared: AtomicU32::new(declared),
            limit: AtomicU32::new(share.of(declared)),
            share,
            used: AtomicU32::new(0),
            waiting: AtomicU64::new(0),
            closed_until: AtomicU64::new(0),
            pacer: pacing.map(|config| Mutex::new(Pacer::new(config))),
            paced: AtomicBool::new(false),
        }
    }

    /// Unique among the gates of a process.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The deployment id, or `deployment/service`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What may run now (`None`: unlimited).
    pub fn limit(&self) -> Option<u32> {
        let limit = self.limit.load(Ordering::Relaxed);
        (limit != UNLIMITED).then_some(limit)
    }

    /// Attempts running through it now.
    pub fn used(&self) -> u32 {
        self.used.load(Ordering::Acquire)
    }

    /// Until when it is closed (ms), if it is at `now`.
    pub fn closed_until(&self, now: u64) -> Option<u64> {
        let until = self.closed_until.load(Ordering::Acquire);
        (until > now).then_some(until)
    }

    fn try_take(&self, now: u64) -> bool {
        if self.closed_until(now).is_some() {
            return false;
        }
        let limit = self.limit.load(Ordering::Relaxed);
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used < limit).then_some(used + 1)
            })
            .is_ok()
    }

    /// Takes a slot for `member`, or records that it waits for one. A slot given back between
    /// the failed take and the record is caught by the second try, so no wake-up is lost.
    pub fn take_or_wait(&self, member: u32, now: u64) -> bool {
        if self.try_take(now) {
            return true;
        }
        self.waiting
            .fetch_or(1 << (member % MEMBERS), Ordering::AcqRel);
        self.try_take(now)
    }

    /// Records that `member` still has work waiting here (a give-back collected its bit, but
    /// another member took the slot first).
    pub fn wait(&self, member: u32) {
        self.waiting
            .fetch_or(1 << (member % MEMBERS), Ordering::AcqRel);
    }

    /// Slots a take at `now` could find (racy, a hint).
    pub fn room(&self, now: u64) -> u32 {
        if self.closed_until(now).is_some() {
            return 0;
        }
        self.limit
            .load(Ordering::Relaxed)
            .saturating_sub(self.used.load(Ordering::Acquire))
    }

    /// Gives a slot back; answers the members that waited for one (their bits are cleared).
    pub fn give_back(&self) -> u64 {
        self.used.fetch_sub(1, Ordering::AcqRel);
        self.collect_waiters()
    }

    fn collect_waiters(&self) -> u64 {
        if self.waiting.load(Ordering::Acquire) == 0 {
            return 0;
        }
        self.waiting.swap(0, Ordering::AcqRel)
    }

    /// What an attempt's end (while it still holds its slot) says about the deployment;
    /// answers the members to nudge when that made room.
    pub fn observe(&self, signal: Signal, now: u64) -> u64 {
        let Some(pacer) = &self.pacer else {
            return 0;
        };
        // Healthy and not paced: nothing to learn from a success, and no lock taken.
        if signal == Signal::Answered && !self.paced.load(Ordering::Acquire) {
            return 0;
        }
        let mut pacer = pacer.lock().unwrap_or_else(|e| e.into_inner());
        let grew = pacer.observe(signal, self.used(), now);
        self.set_limit(self.declared(), pacer.window());
        self.paced
            .store(pacer.window().is_some(), Ordering::Release);
        self.closed_until
            .fetch_max(pacer.closed_until_ms(), Ordering::AcqRel);
        drop(pacer);
        if grew { self.collect_waiters() } else { 0 }
    }

    fn declared(&self) -> u32 {
        self.declared.load(Ordering::Relaxed)
    }

    /// What may run here: this node's part of the declared limit, capped by the pacing window.
    fn set_limit(&self, declared: u32, window: Option<u32>) {
        self.limit.store(
            self.share.of(window.map_or(declared, |w| w.min(declared))),
            Ordering::Relaxed,
        );
    }

    /// The pacing window, while paced.
    fn window(&self) -> Option<u32> {
        self.pacer
            .as_ref()
            .and_then(|p| p.lock().unwrap_or_else(|e| e.into_inner()).window())
    }

    /// A new declared limit. Waiters are not nudged here: a change of the gates bumps their
    /// generation, and every scheduler wakes its queues parked at gates when it sees that.
    fn declare(&self, declared: Option<u32>) {
        let declared = declared.unwrap_or(UNLIMITED);
        if self.declared.swap(declared, Ordering::Relaxed) != declared {
            self.set_limit(declared, self.window());
        }
    }

    /// What operators see.
    pub fn snapshot(&self, now: u64) -> GateSnapshot {
        let declared = self.declared();
        GateSnapshot {
            name: self.name.to_string(),
            declared: (declared != UNLIMITED).then_some(declared),
            window: self.window(),
            limit: self.limit(),
            used: self.used(),
            closed_until_ms: self.closed_until(now),
        }
    }

    /// Whether `waiters` (from [`Gate::give_back`]) names `member`.
    pub fn names(waiters: u64, member: u32) -> bool {
        waiters & (1 << (member % MEMBERS)) != 0
    }
}

/// The gates an attempt of one service passes: its deployment's, then its own.
#[derive(Debug, Clone, Default)]
pub struct GateSet {
    /// The deployment's gate (declared limit and pacing).
    pub deployment: Option<Arc<Gate>>,
    /// The service's own declared limit on that deployment.
    pub service: Option<Arc<Gate>>,
}

/// What a registered deployment declares, for [`Gates::sync`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeploymentLimits {
    /// Its id.
    pub id: String,
    /// Its declared concurrency limit.
    pub concurrency: Option<u32>,
    /// The services it serves now (their latest revision is on it), each with its own limit.
    pub services: Vec<(String, Option<u32>)>,
}

#[cfg(test)]
impl DeploymentLimits {
    /// For tests: deployment `id` declaring `concurrency`, serving `services` with theirs.
    pub(crate) fn of(id: &str, concurrency: Option<u32>, services: &[(&str, Option<u32>)]) -> Self {
        Self {
            id: id.into(),
            concurrency,
            services: services
                .iter()
                .map(|(s, l)| ((*s).to_owned(), *l))
                .collect(),
        }
    }
}

#[derive(Debug, Default)]
struct Table {
    by_name: HashMap<Box<str>, Arc<Gate>>,
    by_service: HashMap<Box<str>, GateSet>,
}

/// Every deployment's gates, by service; shared by the registry (which keeps it in step with
/// the deployments) and every partition's scheduler (which looks gates up by service).
#[derive(Debug)]
pub struct Gates {
    pacing: RwLock<PacingConfig>,
    /// This node's part of every gate's limit.
    share: Arc<Share>,
    table: RwLock<Table>,
    /// Bumps on every change, so schedulers know when to look their queues' gates up again.
    generation: AtomicU64,
    next_id: AtomicU64,
}

impl Default for Gates {
    fn default() -> Self {
        Self::new(PacingConfig::default())
    }
}

impl Gates {
    /// No gates yet.
    pub fn new(pacing: PacingConfig) -> Self {
        Self {
            pacing: RwLock::new(pacing),
            share: Arc::default(),
            table: RwLock::new(Table::default()),
            generation: AtomicU64::new(1),
            next_id: AtomicU64::new(1),
        }
    }

    /// Sets how deployments are paced, at start: the gates are made again by the next
    /// [`Gates::sync`].
    /// The same configuration again changes nothing.
    pub fn configure(&self, pacing: PacingConfig) {
        let mut current = self.pacing.write().unwrap_or_else(|e| e.into_inner());
        if *current == pacing {
            return;
        }
        *current = pacing;
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = Table::default();
    }

    /// Bumps on every change.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The gates of `service` (none when it has no deployment).
    pub fn for_service(&self, service: &str) -> GateSet {
        self.table
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_service
            .get(service)
            .cloned()
            .unwrap_or_default()
    }

    /// Makes the gates match `deployments`: a deployment keeps its gate (and what runs through
    /// it, and its pacing) across changes; a new one gets a new gate; one that left is
    /// forgotten (its running attempts still give their slots back to it). Services only get a
    /// gate of their own when they declare a limit; deployments get one when they declare a
    /// limit or pacing is on.
    pub fn sync(&self, deployments: &[DeploymentLimits]) {
        let pacing = *self.pacing.read().unwrap_or_else(|e| e.into_inner());
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        let mut by_name = HashMap::new();
        let mut by_service = HashMap::new();
        let mut gate = |name: &str, declared: Option<u32>, paced: bool| {
            let gate = match table.by_name.get(name) {
                Some(gate) => {
                    gate.declare(declared);
                    Arc::clone(gate)
                }
                None => Arc::new(Gate::new(
                    self.next_id.fetch_add(1, Ordering::Relaxed),
                    name,
                    declared,
                    paced.then_some(pacing),
                    Arc::clone(&self.share),
                )),
            };
            by_name.insert(Box::<str>::from(name), Arc::clone(&gate));
            gate
        };
        for d in deployments {
            let deployment = (d.concurrency.is_some() || pacing.enabled)
                .then(|| gate(&d.id, d.concurrency, true));
            for (service, limit) in &d.services {
                let own = limit.map(|l| gate(&format!("{}/{service}", d.id), Some(l), false));
                by_service.insert(
                    Box::<str>::from(service.as_str()),
                    GateSet {
                        deployment: deployment.clone(),
                        service: own,
                    },
                );
            }
        }
        *table = Table {
            by_name,
            by_service,
        };
        drop(table);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Cluster mode: this node leads the partitions `led` marks; every gate lets through this
    /// node's part of its limit from now on ([`Share`]).
    pub fn lead(&self, led: Vec<bool>) {
        *self.share.led.write().unwrap_or_else(|e| e.into_inner()) = Some(led);
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        for gate in table.by_name.values() {
            gate.set_limit(gate.declared(), gate.window());
        }
        drop(table);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Every live gate, by name.
    pub fn snapshot(&self, now: u64) -> Vec<GateSnapshot> {
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<GateSnapshot> = table.by_name.values().map(|g| g.snapshot(now)).collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_run_their_partitions_parts_of_a_limit_which_add_up_to_it() {
        let share = |led: &[bool], limit| {
            let share = Share::default();
            *share.led.write().unwrap() = Some(led.to_vec());
            share.of(limit)
        };
        // Two nodes, four partitions each way.
        for limit in [4, 5, 7, 100] {
            let (a, b) = (
                share(&[true, true, false, false], limit),
                share(&[false, false, true, true], limit),
            );
            assert_eq!(a + b, limit, "{limit}: {a} + {b}");
        }
        // A limit below the nodes' count: each leading node runs 1, none waits for good.
        assert_eq!(share(&[true, false, false, false], 2), 1);
        assert_eq!(share(&[false, false, false, false], 2), 0);
        assert_eq!(Share::default().of(3), 3, "embedded: the whole limit");
        assert_eq!(share(&[true, false], UNLIMITED), UNLIMITED);
        // A gate follows the partitions led.
        let gates = Gates::default();
        gates.sync(&[DeploymentLimits {
            id: "dp".into(),
            concurrency: Some(4),
            services: vec![("S".into(), None)],
        }]);
        let gate = gates.for_service("S").deployment.unwrap();
        assert_eq!(gate.limit(), Some(4));
        gates.lead(vec![true, false, false, false]);
        assert_eq!(gate.limit(), Some(1));
        gates.lead(vec![true, true, true, false]);
        assert_eq!(gate.limit(), Some(3));
    }

    #[test]
    fn a_declared_limit_bounds_and_names_its_waiters() {
        let gates = Gates::new(PacingConfig {
            enabled: false,
            ..PacingConfig::default()
        });
        gates.sync(&[DeploymentLimits::of(
            "dp_1",
            Some(2),
            &[("a", None), ("b", Some(1))],
        )]);
        let a = gates.for_service("a");
        let gate = a.deployment.expect("declared");
        assert!(a.service.is_none());
        assert!(gate.take_or_wait(0, 0) && gate.take_or_wait(0, 0));
        assert!(!gate.take_or_wait(5, 0));
        assert!(Gate::names(gate.give_back(), 5));
        let b = gates.for_service("b").service.expect("b declares its own");
        assert!(b.take_or_wait(0, 0) && !b.take_or_wait(1, 0));
        assert!(gates.for_service("c").deployment.is_none());
    }

    #[test]
    fn a_deployment_keeps_its_gate_across_changes_and_a_raised_limit_is_seen() {
        let gates = Gates::default();
        let before = gates.generation();
        gates.sync(&[DeploymentLimits::of("dp_1", Some(1), &[("a", None)])]);
        assert!(gates.generation() > before);
        let gate = gates.for_service("a").deployment.expect("gate");
        assert!(gate.take_or_wait(0, 0) && !gate.take_or_wait(3, 0));
        gates.sync(&[DeploymentLimits::of("dp_1", Some(4), &[("a", None)])]);
        let again = gates.for_service("a").deployment.expect("gate");
        assert_eq!(again.id(), gate.id());
        assert_eq!(again.used(), 1, "what runs stays counted");
        assert!(
            gates.generation() > before + 1,
            "schedulers see the change and look again"
        );
        assert!(again.take_or_wait(3, 0));
        // Pacing on: an undeclared deployment still has a gate, unlimited until it fails.
        gates.sync(&[DeploymentLimits::of("dp_2", None, &[("a", None)])]);
        let paced = gates.for_service("a").deployment.expect("paced gate");
        assert_ne!(paced.id(), gate.id());
        assert_eq!(paced.limit(), None);
    }

    #[test]
    fn failures_pace_a_deployment_and_retry_after_closes_it() {
        let gates = Gates::default();
        gates.sync(&[DeploymentLimits::of("dp_1", None, &[("a", None)])]);
        let gate = gates.for_service("a").deployment.expect("gate");
        for _ in 0..10 {
            assert!(gate.take_or_wait(0, 0));
        }
        gate.observe(Signal::Down, 0);
        assert_eq!(gate.limit(), None, "one failure is noise");
        gate.observe(Signal::Down, 0);
        assert_eq!(gate.limit(), Some(2));
        for _ in 0..10 {
            gate.give_back();
        }
        assert!(!gate.take_or_wait(0, 50), "the next probes wait 100 ms");
        assert!(gate.take_or_wait(0, 100) && gate.take_or_wait(0, 100));
        assert!(!gate.take_or_wait(1, 100));
        assert!(
            Gate::names(gate.observe(Signal::Answered, 10), 1),
            "the window grew"
        );
        assert_eq!(gate.limit(), Some(3));
        gate.observe(
            Signal::Overloaded {
                retry_after_ms: Some(1_000),
            },
            100,
        );
        gate.give_back();
        gate.give_back();
        assert_eq!(gate.room(500), 0, "closed for its Retry-After");
        assert!(!gate.take_or_wait(1, 500));
        assert!(gate.room(1_100) > 0);
        assert_eq!(gate.snapshot(500).closed_until_ms, Some(1_100));
    }
}
