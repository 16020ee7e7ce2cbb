//! What an ended call spent is charged to the budgets of its counters (scope, L1 and L2), in
//! the same write set as its end: a crash cannot lose a charge (the end is not stored either,
//! so the call runs again and reports again) nor make one twice (the end is stored, so the
//! call never ends again). What it held reserved goes back at the same time.

use super::model::effect::Effect;
use super::task::Partition;
use sluice_flow::Measure;
use sluice_store::invocation::Status;
use sluice_store::storage::writer::WriteSet;

impl Partition {
    /// Charges the calls that ended among `effects` (an ending pushes exactly one
    /// [`Effect::Evict`], see `ending::complete`) and puts the budgets they changed into
    /// `writes`, which holds their ends.
    pub(super) fn charge_ended(&mut self, effects: &[Effect], writes: &mut WriteSet) {
        let now = self.outside.driver.now_ms();
        let mut charged = false;
        for effect in effects {
            let Effect::Evict(id) = effect else {
                continue;
            };
            let Some(live) = self.live.get_mut(id) else {
                continue;
            };
            if live.record().status != Status::Completed || live.record().scope.is_none() {
                continue;
            }
            let cost = live.record().cost.unwrap_or(0);
            let reserved = live.reserved.take();
            if cost == 0 && reserved.is_none() {
                continue;
            }
            let key = super::admission::queue_key(&self.outside.registry, live.record());
            self.admission
                .scheduler
                .charge(&key, cost, reserved.as_deref(), now);
            if cost > 0 {
                self.admission.unstored_charges.push((key, cost));
            }
            charged = true;
        }
        if charged {
            for (counter, used) in self.admission.scheduler.take_use_writes(Measure::Cost) {
                sluice_store::invocation::quotas::put(
                    writes,
                    Measure::Cost,
                    self.outside.index,
                    &counter,
                    used,
                );
            }
        }
    }

    /// The write set holding the charges made since the last call goes to the writer: they
    /// are its.
    pub(super) fn charges_handed_over(&mut self) {
        self.admission.unstored_charges.clear();
    }

    /// The write set holding the charges made since it started was dropped (its batch
    /// failed): they are taken back, or the next charge's total would store them without the
    /// ends they belong to (the calls run again after a restart and are charged then).
    pub(super) fn charges_dropped(&mut self) {
        let now = self.outside.driver.now_ms();
        for (key, cost) in std::mem::take(&mut self.admission.unstored_charges) {
            self.admission.scheduler.uncharge(&key, cost, now);
        }
    }
}
