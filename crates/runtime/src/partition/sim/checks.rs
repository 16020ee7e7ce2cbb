//! What the simulator checks: acknowledged invocations are stored, and once the faults stop
//! everything acknowledged completes.

use super::*;

impl World {
    /// `flow.inherit-scope` (on in the simulator's configuration): the simulated handlers'
    /// calls name no scope, so each child carries its caller's.
    fn check_inherited_scopes(&mut self, store: &Store) {
        let listed = store
            .with_db(|db| records::load_listed(db, |_| true, usize::MAX))
            .expect("the store is open")
            .expect("records read back");
        let scopes: std::collections::HashMap<InvocationId, _> = listed
            .iter()
            .map(|r| (r.id, (r.scope.clone(), r.limit_key.clone())))
            .collect();
        for child in &listed {
            let Some(caller) = child.caller else {
                continue;
            };
            if let Some(theirs) = scopes.get(&caller.id) {
                assert_eq!(
                    &(child.scope.clone(), child.limit_key.clone()),
                    theirs,
                    "child {} of {} does not run under its caller's scope",
                    child.id,
                    caller.id
                );
                self.stats.inherited += u64::from(theirs.0.is_some());
            }
        }
    }

    /// Scope `s1`'s budget spent exactly what its ended calls were charged, each once: the
    /// charge is stored in the same write set as the call's end, so no crash, disk failure or
    /// leadership change can store one without the other.
    pub(super) fn check_budget(&mut self) {
        let store = Arc::clone(&self.node().store);
        let read = store.with_db(|db| {
            let records = records::load_records(db).expect("records read back");
            let spent = sluice_store::invocation::quotas::load(db, sluice_flow::Measure::Cost, 0)
                .expect("budgets read back");
            let purges = records::due_purges(db, u64::MAX - 1, usize::MAX, |_| true)
                .expect("purges read back");
            (records, spent, purges)
        });
        let (stored, spent, purges) = read.expect("the store is open");
        // A purge written since the last look landed if its row is gone (its id may hold a new
        // run by now, with a purge row of its own).
        for (purge, cost) in std::mem::take(&mut self.s1_purging) {
            if !purges.contains(&purge) {
                self.s1_retired += cost;
            }
        }
        // The simulation stays within its first month, the budget's window.
        let month = sluice_flow::QuotaWindow::Month;
        if self.now() >= month.next(month.start(EPOCH_MS)) {
            return;
        }
        let spent = spent
            .into_iter()
            .find(|(counter, _)| counter == "s1")
            .map_or(0, |(_, used)| used.used);
        let charged = self.s1_retired + stored.iter().map(s1_cost).sum::<u64>();
        assert_eq!(
            spent, charged,
            "scope s1's budget spent {spent}, its ended calls were charged {charged}"
        );
        self.stats.charged = charged;
    }

    pub(super) fn check_acked_are_stored(&mut self) {
        self.check_budget();
        let store = &self.node.as_ref().expect("the node runs").store;
        let purged = &self.purged;
        for (id, _) in self
            .acked
            .iter()
            .filter(|(id, a)| a.acks > 0 && !purged.contains(id))
        {
            let stored = store
                .with_db(|db| records::load_record(db, *id))
                .expect("the store is open")
                .expect("records read back");
            assert!(
                stored.is_some(),
                "invocation {id} was acknowledged but is not in the store after a restart"
            );
            if let Some(answered) = self.answered.get(id) {
                assert_eq!(
                    stored.and_then(|r| r.outcome).as_ref(),
                    Some(answered),
                    "call {id} was answered, but its outcome is not in the store after a restart"
                );
            }
        }
    }

    /// The faults stop: every acknowledged invocation must now complete.
    pub(super) fn settle(&mut self) {
        // A restart first: it ends attempts the deployment stopped answering (as their
        // timeouts would) and a disk failure still counting down.
        self.crash();
        for round in 0..20_000 {
            let mut paused: Vec<InvocationId> = self
                .node()
                .partition
                .live
                .iter()
                .filter(|(_, live)| live.record().status == Status::Paused)
                .map(|(id, _)| *id)
                .collect();
            // In id order: a hash map's order differs between processes.
            paused.sort_unstable();
            for id in paused {
                let (reply, _) = oneshot::channel();
                self.deliver(
                    vec![Event::Control {
                        id,
                        op: Control::Resume,
                        reply,
                    }],
                    true,
                );
            }
            if !self.node().attempts.is_empty() {
                // Every attempt runs to its end; their events go in together.
                for _ in 0..self.node().attempts.len() {
                    self.progress(false);
                }
                self.pump();
                continue;
            }
            let node = self.node();
            let unfinished = node
                .partition
                .live
                .values()
                .any(|l| l.record().status != Status::Completed)
                || !node.partition.resting.is_empty();
            if !unfinished {
                return self.check_completed();
            }
            // The next wake-up, or the next token a queue waits for, whichever comes first.
            let next = node
                .partition
                .wakes
                .peek()
                .map(|std::cmp::Reverse((at, _, _))| *at)
                .into_iter()
                .chain(node.partition.admission.scheduler.next_timer())
                .min();
            let now = self.now();
            let wait = next.map_or(1_000, |at| at.saturating_sub(now).max(1));
            self.advance(wait);
            if round == 19_999 {
                panic!(
                    "acknowledged invocations never complete:\n{}",
                    self.unfinished()
                );
            }
        }
    }

    /// What is not done, for a failure's message.
    pub(super) fn unfinished(&mut self) -> String {
        let partition = &self.node().partition;
        let mut out = String::new();
        for (id, live) in partition
            .live
            .iter()
            .filter(|(_, l)| l.record().status != Status::Completed)
            .take(8)
        {
            out += &format!(
                "{id} {:?} status {:?} run {:?} attempts {} journal {} waiting {:?}\n",
                live.record().target,
                live.record().status,
                live.run(),
                live.record().attempts,
                live.journal.len(),
                partition.waiting(*id)
            );
        }
        for (lock, entry, _) in partition.admission.scheduler.held_locks() {
            let holder = partition.entries.holder(entry);
            let live = holder.and_then(|id| partition.live.get(&id));
            out += &format!(
                "lock {:?} held by {holder:?}: {:?}\n",
                lock.object_key,
                live.map(|l| (
                    l.record().status,
                    l.run(),
                    l.record().attempts,
                    l.lock.is_some()
                ))
            );
        }
        out += &format!(
            "{} at rest, {} wake-ups",
            partition.resting.len(),
            partition.wakes.len()
        );
        out
    }

    /// Every acknowledged invocation completed, with its state writes; every call a scoped
    /// handler made (naming no scope) ran under its caller's scope and limit key.
    pub(super) fn check_completed(&mut self) {
        self.check_budget();
        let store = Arc::clone(&self.node().store);
        self.check_inherited_scopes(&store);
        let purged = &self.purged;
        for (id, acked) in self
            .acked
            .iter()
            .filter(|(id, a)| a.acks > 0 && !purged.contains(id))
        {
            let record = store
                .with_db(|db| records::load_record(db, *id))
                .expect("the store is open")
                .expect("records read back")
                .unwrap_or_else(|| panic!("acknowledged invocation {id} is lost"));
            assert_eq!(
                record.status,
                Status::Completed,
                "acknowledged invocation {id} never completed"
            );
            self.stats.completed += 1;
            let killed = matches!(&record.outcome, Some(Outcome::Failure(f)) if f.code == 409);
            if acked.program.contains(&b'w') && !killed {
                let key = acked
                    .target
                    .key
                    .as_deref()
                    .expect("state writes are on objects");
                let object = state::Object {
                    scope: "",
                    service: &acked.target.service,
                    key,
                };
                let value = store
                    .with_db(|db| state::get(db, object, &sdk::state_key(*id)))
                    .expect("the store is open")
                    .expect("state reads back");
                assert!(
                    value.is_some(),
                    "invocation {id} completed without its state write"
                );
            }
        }
    }
}
