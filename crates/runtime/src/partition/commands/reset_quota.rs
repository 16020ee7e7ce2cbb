//! Quota and budget reset: an operator starts the quota counts (or budget spends) a pattern
//! matches again (`sluice rules reset-quota`, `sluice rules reset-budget`). The counts at 0 are stored with this batch first; the scheduler follows once
//! they are (`Effect::ResetQuota`), so a crash between cannot leave a reset the store never saw.

use tokio::sync::oneshot;

use super::super::model::effect::Effect;
use sluice_flow::scheduler::Scheduler;
use sluice_store::storage::writer::WriteSet;

/// Resets the quota counts (or budget spends, as `measure` says) of partition `index` that
/// `pattern` matches among `scheduler`'s.
pub(super) fn reset_quota(
    scheduler: &Scheduler,
    index: u32,
    measure: sluice_flow::Measure,
    pattern: Box<sluice_flow::RulePattern>,
    reply: oneshot::Sender<u64>,
    writes: &mut WriteSet,
    effects: &mut Vec<Effect>,
) {
    // What the reset writes, stored with this batch; admissions after it write again.
    for (counter, used) in scheduler.reset_plan(measure, &pattern) {
        sluice_store::invocation::quotas::put(writes, measure, index, &counter, used);
    }
    effects.push(Effect::ResetQuota(measure, pattern, reply));
}
