//! The deployment gates this scheduler's queues pass through ([`crate::gates`]): interned by
//! gate, each with the queues of this partition parked at it.
//!
//! Entries are counted by the queues and permits that name them and by the service cache, and
//! go when none does, so a deployment replaced long ago leaves nothing behind.

use std::collections::VecDeque;
use std::sync::Arc;

use hashbrown::HashMap;

use super::{Permit, QueueId, Scheduler};
use crate::gates::{Gate, Gates};
use crate::pacing::Signal;

/// The gates a queue's attempts pass, as indexes into the table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct QueueGates {
    /// The deployment's gate.
    pub deployment: Option<u32>,
    /// The service's own gate on that deployment.
    pub service: Option<u32>,
}

impl QueueGates {
    fn each(self) -> impl Iterator<Item = u32> {
        self.deployment.into_iter().chain(self.service)
    }
}

#[derive(Debug)]
struct Entry {
    gate: Arc<Gate>,
    refs: u32,
    parked: VecDeque<QueueId>,
}

/// This scheduler's gates.
#[derive(Debug, Default)]
pub(super) struct GateTable {
    source: Option<Arc<Gates>>,
    generation: u64,
    entries: Vec<Option<Entry>>,
    free: Vec<u32>,
    by_id: HashMap<u64, u32>,
    /// Service → gates, looked up since the last change (holds a reference to each).
    by_service: HashMap<Box<str>, QueueGates>,
    /// Entries with queues parked at them.
    parked_at: Vec<u32>,
}

impl GateTable {
    pub(super) fn new(source: Option<Arc<Gates>>) -> Self {
        let generation = source.as_ref().map_or(0, |s| s.generation());
        Self {
            source,
            generation,
            ..Self::default()
        }
    }

    pub(super) fn gate(&self, index: u32) -> &Arc<Gate> {
        &self.entry(index).gate
    }

    fn entry(&self, index: u32) -> &Entry {
        self.entries[index as usize].as_ref().expect("live gate")
    }

    fn entry_mut(&mut self, index: u32) -> &mut Entry {
        self.entries[index as usize].as_mut().expect("live gate")
    }

    fn intern(&mut self, gate: Arc<Gate>) -> u32 {
        if let Some(&index) = self.by_id.get(&gate.id()) {
            self.entry_mut(index).refs += 1;
            return index;
        }
        let entry = Entry {
            gate,
            refs: 1,
            parked: VecDeque::new(),
        };
        let id = entry.gate.id();
        let index = match self.free.pop() {
            Some(index) => {
                self.entries[index as usize] = Some(entry);
                index
            }
            None => {
                self.entries.push(Some(entry));
                u32::try_from(self.entries.len() - 1).expect("fewer than 2^32 gates")
            }
        };
        self.by_id.insert(id, index);
        index
    }

    /// The gates of `service`, with a reference for the queue that asks.
    pub(super) fn resolve(&mut self, service: &str) -> QueueGates {
        let Some(source) = &self.source else {
            return QueueGates::default();
        };
        let gates = match self.by_service.get(service) {
            Some(gates) => *gates,
            None => {
                let set = source.for_service(service);
                let gates = QueueGates {
                    deployment: set.deployment.map(|g| self.intern(g)),
                    service: set.service.map(|g| self.intern(g)),
                };
                self.by_service.insert(service.into(), gates);
                gates
            }
        };
        self.hold(gates);
        gates
    }

    /// One more queue or permit names `gates`.
    pub(super) fn hold(&mut self, gates: QueueGates) {
        for index in gates.each() {
            self.entry_mut(index).refs += 1;
        }
    }

    /// One fewer queue or permit names `gates`; an entry nothing names goes once no queue is
    /// parked at it (a queue that looked its gates up again still waits at the old one until
    /// it is woken).
    pub(super) fn unref(&mut self, gates: QueueGates) {
        for index in gates.each() {
            let entry = self.entry_mut(index);
            entry.refs -= 1;
            if entry.refs == 0 && entry.parked.is_empty() {
                self.remove(index);
            }
        }
    }

    fn remove(&mut self, index: u32) {
        let entry = self.entries[index as usize].take().expect("live gate");
        self.by_id.remove(&entry.gate.id());
        self.free.push(index);
    }

    /// Drops the entries nothing names and no queue waits at any more.
    pub(super) fn drop_unreferenced(&mut self) {
        for index in 0..self.entries.len() {
            if self.entries[index]
                .as_ref()
                .is_some_and(|e| e.refs == 0 && e.parked.is_empty())
            {
                self.remove(u32::try_from(index).expect("fewer than 2^32 gates"));
            }
        }
    }

    /// Whether the registry changed since the last call: cached lookups are dropped, and the
    /// caller looks its queues' gates up again.
    pub(super) fn changed(&mut self) -> bool {
        let Some(source) = &self.source else {
            return false;
        };
        let generation = source.generation();
        if generation == self.generation {
            return false;
        }
        self.generation = generation;
        let cached: Vec<QueueGates> = self.by_service.drain().map(|(_, g)| g).collect();
        for gates in cached {
            self.unref(gates);
        }
        true
    }

    /// Takes a slot at each of `gates` for `member`; on failure gives back what it took and
    /// answers the gate that is full, and the members to nudge.
    pub(super) fn take(&self, gates: QueueGates, member: u32, now: u64) -> Result<(), (u32, u64)> {
        let Some(deployment) = gates.deployment else {
            return match gates.service {
                Some(service) if !self.gate(service).take_or_wait(member, now) => Err((service, 0)),
                _ => Ok(()),
            };
        };
        if !self.gate(deployment).take_or_wait(member, now) {
            return Err((deployment, 0));
        }
        match gates.service {
            Some(service) if !self.gate(service).take_or_wait(member, now) => {
                Err((service, self.gate(deployment).give_back()))
            }
            _ => Ok(()),
        }
    }

    /// Gives back the slots `gates` took; answers the members to nudge.
    pub(super) fn give_back(&self, gates: QueueGates) -> u64 {
        gates
            .each()
            .fold(0, |nudge, index| nudge | self.gate(index).give_back())
    }

    /// Parks `q` at the gate `index`: at the back of its line, or at the front when it was
    /// woken there and found the slot taken again.
    pub(super) fn park(&mut self, index: u32, q: QueueId, first_in_line: bool) {
        let entry = self.entry_mut(index);
        if first_in_line {
            entry.parked.push_front(q);
        } else {
            entry.parked.push_back(q);
        }
        if entry.parked.len() == 1 {
            self.parked_at.push(index);
        }
    }

    pub(super) fn unpark(&mut self, index: u32, q: QueueId) {
        let entry = self.entry_mut(index);
        entry.parked.retain(|p| *p != q);
        if entry.parked.is_empty() {
            self.parked_at.retain(|i| *i != index);
        }
    }

    /// Queues parked at gates with room now, as many as each has room for, in the order they
    /// parked; `all` takes every parked queue (the gates changed).
    ///
    /// Queues left parked keep `member`'s bit raised at their gate: the give-back that nudged
    /// this partition collected it, and without it the next give-back would not name it.
    pub(super) fn wake(&mut self, now: u64, all: bool, member: u32, woken: &mut Vec<u32>) {
        let mut i = 0;
        while i < self.parked_at.len() {
            let index = self.parked_at[i];
            let entry = self.entries[index as usize].as_mut().expect("live gate");
            let room = |gate: &Gate| {
                if all {
                    usize::MAX
                } else {
                    gate.room(now) as usize
                }
            };
            let n = room(&entry.gate).min(entry.parked.len());
            woken.extend(entry.parked.drain(..n).map(|q| q.0));
            if !entry.parked.is_empty() {
                entry.gate.wait(member);
                // A slot given back between the look and the bit: the bit missed it.
                let n = room(&entry.gate).min(entry.parked.len());
                woken.extend(entry.parked.drain(..n).map(|q| q.0));
            }
            if entry.parked.is_empty() {
                self.parked_at.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Gates in the table (for tests: nothing is left behind).
    #[cfg(test)]
    pub(super) fn live(&self) -> usize {
        self.entries.iter().flatten().count()
    }

    /// When a closed gate with parked queues opens again, if one is closed.
    pub(super) fn next_open(&self, now: u64) -> Option<u64> {
        self.parked_at
            .iter()
            .filter_map(|index| self.gate(*index).closed_until(now))
            .min()
    }
}

impl Scheduler {
    /// What the end of the attempt behind `permit` says about its deployment (before the
    /// permit is released): it paces the deployment's next attempts.
    pub fn report(&mut self, permit: &Permit, signal: Signal, now: u64) {
        if let Some(gate) = permit.gates.deployment {
            self.nudge |= self.gates.gate(gate).observe(signal, now);
        }
    }

    /// The registry's gates changed: every queue looks its gates up again, and the queues
    /// parked at gates look again. Otherwise queues parked at gates with room wake.
    pub(super) fn refresh_gates(&mut self, now: u64) {
        let changed = self.gates.changed();
        if changed {
            for slot in 0..self.queues.len() {
                let Some(queue) = self.queues[slot].as_ref() else {
                    continue;
                };
                let service = queue.key.service.clone();
                let old = queue.gates;
                let new = self.gates.resolve(&service);
                self.queues[slot].as_mut().expect("live queue").gates = new;
                self.gates.unref(old);
            }
        }
        self.gates.wake(now, changed, self.member, &mut self.woken);
        if changed {
            self.gates.drop_unreferenced();
        }
        self.wake_pending(now);
    }
}
