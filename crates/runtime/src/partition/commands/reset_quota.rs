//! Quota reset: an operator starts the quota counts a pattern matches again (`sluice rules
//! reset-quota`). The counts at 0 are stored with this batch first; the scheduler follows once
//! they are (`Effect::ResetQuota`), so a crash between cannot leave a reset the store never saw.

use tokio::sync::oneshot;

use super::super::model::effect::Effect;
use super::super::task::Partition;
use crate::storage::writer::WriteSet;

impl Partition {
    pub(in super::super) fn reset_quota(
        &mut self,
        pattern: Box<crate::flow::RulePattern>,
        reply: oneshot::Sender<u64>,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) {
        // What the reset writes, stored with this batch; admissions after it write again.
        for (counter, used) in self.scheduler.quota_reset_plan(&pattern) {
            crate::invocation::quotas::put(writes, self.index, &counter, used);
        }
        effects.push(Effect::ResetQuota(pattern, reply));
    }
}
