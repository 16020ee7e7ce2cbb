//! The partition's resting part: the invocations at rest (`dormant.rs` says what one keeps),
//! with the bookkeeping that follows them — the bytes they take, how many each scope has, the
//! waits for their outcomes, and the invocations queued since the last dispatch that may go to
//! rest after it. Every change goes through [`Resting::put`] and [`Resting::wake`], so the
//! counts match the map by construction.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::dormant::{Dormant, HeldMemory};
use crate::partition::live::Live;
use sluice_config::WorkerConfig;
use sluice_config::flow::FlowConfig;
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::InvocationId;
use sluice_flow::Scope;
use sluice_store::invocation::{InvocationRecord, Outcome};
use sluice_store::storage::Store;

/// The invocations at rest on one partition and what follows them.
#[derive(Debug)]
pub(in crate::partition) struct Resting {
    /// Held invocations that never ran (or wait for their time), in a compact form.
    dormant: HashMap<InvocationId, Dormant>,
    /// The footprints of `dormant` summed as they come and go: the metrics sample reads it
    /// every `flow.history-interval`, and walking millions of resting invocations for it
    /// stalled the partition's loop for tens of milliseconds.
    bytes: u64,
    /// Invocations at rest per scope (every invocation of a scope lives on its partition).
    in_scope: HashMap<Scope, usize>,
    /// Waits for the outcome of invocations at rest, handed to them when they wake.
    waiting: HashMap<InvocationId, Vec<oneshot::Sender<Outcome>>>,
    /// Invocations queued (or delayed) since the last dispatch: those still waiting after it
    /// go to rest.
    just_queued: Vec<InvocationId>,
    /// Invocations at rest in all partitions, and the memory their inputs take (shared).
    held: Arc<HeldMemory>,
}

impl Resting {
    /// Nothing at rest yet; `held` counts across the process's partitions.
    pub(in crate::partition) fn new(held: Arc<HeldMemory>) -> Self {
        Self {
            dormant: HashMap::new(),
            bytes: 0,
            in_scope: HashMap::new(),
            waiting: HashMap::new(),
            just_queued: Vec::new(),
            held,
        }
    }

    /// What invocations hold in memory across every partition.
    pub(in crate::partition) fn held(&self) -> &Arc<HeldMemory> {
        &self.held
    }

    /// Whether `id` is at rest.
    pub(in crate::partition) fn contains(&self, id: &InvocationId) -> bool {
        self.dormant.contains_key(id)
    }

    /// What `id` keeps at rest, if it is.
    pub(in crate::partition) fn peek(&self, id: &InvocationId) -> Option<&Dormant> {
        self.dormant.get(id)
    }

    /// How many are at rest on this partition.
    pub(in crate::partition) fn len(&self) -> usize {
        self.dormant.len()
    }

    /// Nothing is at rest on this partition.
    #[cfg(test)]
    pub(in crate::partition) fn is_empty(&self) -> bool {
        self.dormant.is_empty()
    }

    /// Test builds: the counts kept as invocations come and go match a walk of the map.
    #[cfg(test)]
    pub(in crate::partition) fn assert_consistent(&self) {
        let bytes: u64 = self.dormant.values().map(Dormant::footprint).sum();
        assert_eq!(
            self.bytes, bytes,
            "the bytes follow the invocations at rest"
        );
        let scoped: usize = self.in_scope.values().sum();
        assert!(
            scoped <= self.dormant.len() && self.in_scope.values().all(|n| *n > 0),
            "every scope's count is of invocations at rest: {:?}",
            self.in_scope
        );
    }

    /// The bytes they take.
    pub(in crate::partition) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Every invocation at rest.
    pub(in crate::partition) fn iter(&self) -> impl Iterator<Item = (&InvocationId, &Dormant)> {
        self.dormant.iter()
    }

    /// `id` was queued (or delayed): it goes to rest after the next dispatch if it still waits.
    pub(in crate::partition) fn note_queued(&mut self, id: InvocationId) {
        self.just_queued.push(id);
    }

    /// `id` changed in a write not stored yet: it stays in memory (a record at rest must read
    /// back as the store has it).
    pub(in crate::partition) fn keep_awake(&mut self, id: InvocationId) {
        self.just_queued.retain(|queued| *queued != id);
    }

    /// Puts the invocations queued since the last call to rest, taken out of `live`, if they
    /// still only wait.
    pub(in crate::partition) fn put_waiting(
        &mut self,
        live: &mut HashMap<InvocationId, Box<Live>>,
        store: &Store,
    ) {
        for id in std::mem::take(&mut self.just_queued) {
            if !live.get(&id).is_some_and(|live| Dormant::fits(live)) {
                continue;
            }
            if let Some(invocation) = live.remove(&id) {
                self.put(id, *invocation, store);
            }
        }
    }

    /// Puts `live` to rest under `id`.
    fn put(&mut self, id: InvocationId, live: Live, store: &Store) {
        let scope = live.record().scope.clone();
        let dormant = Dormant::of(live, store, &self.held);
        self.bytes += dormant.footprint();
        self.dormant.insert(id, dormant);
        if let Some(scope) = scope {
            *self.in_scope.entry(scope).or_default() += 1;
        }
    }

    /// Wakes `id` if it is at rest: its record and input back in memory, with the waits that
    /// joined it at rest, and noted as queued (it goes back to rest after the next dispatch if
    /// it still only waits). `None` when it is not at rest; an error when the store cannot
    /// give it back (it stays at rest).
    pub(in crate::partition) fn wake(
        &mut self,
        id: InvocationId,
        store: &Store,
    ) -> Option<Result<Live, CodedError>> {
        let dormant = self.dormant.get(&id)?;
        let mut live = match dormant.wake(id, store, &self.held) {
            Ok(live) => live,
            Err(e) => return Some(Err(e)),
        };
        if let Some(dormant) = self.dormant.remove(&id) {
            self.bytes = self.bytes.saturating_sub(dormant.footprint());
        }
        if let Some(scope) = &live.record().scope
            && let Some(count) = self.in_scope.get_mut(scope)
        {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.in_scope.remove(scope);
            }
        }
        live.waiters
            .extend(self.waiting.remove(&id).unwrap_or_default());
        self.just_queued.push(id);
        Some(Ok(live))
    }

    /// Waits for the outcome of `id`, at rest, without waking it: the wait joins the
    /// invocation when it wakes. Waits whose requester left are pruned first; past `max` the
    /// wait is refused (SEC0008).
    pub(in crate::partition) fn wait(
        &mut self,
        id: InvocationId,
        waiter: oneshot::Sender<Outcome>,
        max: usize,
    ) -> Result<(), CodedError> {
        let waiters = self.waiting.entry(id).or_default();
        if waiters.len() >= max || waiters.len() % 64 == 63 {
            waiters.retain(|w| !w.is_closed());
        }
        if waiters.len() >= max {
            return Err(CodedError::new(
                Code::SEC0008,
                format!(
                    "{} requests already wait for invocation {id}, the most worker.max-waiters-per-invocation allows",
                    waiters.len()
                ),
            )
            .retry_after(1));
        }
        waiters.push(waiter);
        Ok(())
    }

    /// Why a new invocation must not be taken now (FLO0001): too many invocations held in all,
    /// or in its scope (a scope's invocations all live on its partition).
    pub(in crate::partition) fn over_limits(
        &self,
        record: &InvocationRecord,
        worker: &WorkerConfig,
        flow: &FlowConfig,
    ) -> Option<CodedError> {
        let total = self.held.count();
        if total >= worker.max_held_invocations {
            return Some(CodedError::new(
                Code::FLO0001,
                format!(
                    "{total} invocations are held, the most worker.max-held-invocations allows; retry later"
                ),
            ));
        }
        // Near the bound, the lowest priorities are shed first, so higher ones still get in.
        let priority = record.priority.unwrap_or_default().get();
        let bound = flow.shed_bound(worker.max_held_invocations, priority);
        if total >= bound {
            return Some(CodedError::new(
                Code::FLO0001,
                format!(
                    "{total} invocations are held: new work of priority {priority} is shed from {bound} held (flow.shed-from of worker.max-held-invocations {}); retry later or send with a higher priority",
                    worker.max_held_invocations
                ),
            ));
        }
        let scope = record.scope.as_ref()?;
        let in_scope = self.in_scope.get(scope).copied().unwrap_or(0);
        (in_scope >= worker.max_held_per_scope).then(|| {
            CodedError::new(
                Code::FLO0001,
                format!(
                    "{in_scope} invocations are held in scope '{scope}', the most worker.max-held-per-scope allows; retry later"
                ),
            )
        })
    }
}
