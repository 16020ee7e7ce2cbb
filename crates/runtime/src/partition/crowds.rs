//! A rule's `on_full` (`sluice_flow::rules::OnFull`) at the partition: the scheduler judges a
//! new invocation as it joins its queue and names who goes (`scheduler/crowds.rs`); here each
//! one named is ended by a wake-up of the next batch, because ending is a write and the
//! judging may run after a commit. A dropped or replaced invocation completes with 409, never
//! run (`FLO0007`, `FLO0008`), its callers, attaches and idempotent repeats reading that; a
//! running one gets the cancel signal an operator's cancel gives. Until that wake-up it is in
//! no queue; a restart before it queues it again, and it is judged again, by arrival time, so
//! the same one goes.

use std::cmp::Reverse;

use super::live::Live;
use super::model::effect::Effect;
use super::model::operator::Control;
use super::model::phase::Run;
use super::task::Partition;
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::InvocationId;
use sluice_flow::scheduler::{CrowdedOut, Fate};
use sluice_store::invocation::Status;
use sluice_store::invocation::store::Timer;
use sluice_store::storage::writer::WriteSet;

/// The completion id of a wake-up that ends an invocation a rule's `on_full` named (never
/// stored as a timer).
pub(super) const CROWDED: u32 = u32::MAX - 2;

/// One an `on_full` named, until its wake-up ends it.
#[derive(Debug, Clone)]
pub(super) struct Crowded {
    out: CrowdedOut,
    /// The invocation whose arrival decided it.
    by: Option<InvocationId>,
}

impl Partition {
    /// Takes what the scheduler's `on_full` decisions named out of their queues and has a
    /// wake-up of the next batch end each.
    pub(super) fn settle_crowds(&mut self) {
        let named = self.admission.scheduler.take_crowded();
        if named.is_empty() {
            return;
        }
        let now = self.outside.driver.now_ms();
        for out in named {
            let Some(id) = self.entries.holder(out.entry) else {
                continue;
            };
            if out.fate != Fate::Cancel {
                self.rouse(id);
                self.observe();
                if let Some(live) = self.live.get_mut(&id)
                    && live.run().queue().is_some()
                {
                    live.set_run(Run::IDLE);
                }
            }
            let by = self.entries.holder(out.why.by);
            self.admission.crowded.insert(id, Crowded { out, by });
            self.wakes.push(Reverse((
                now,
                id,
                Some(Timer {
                    at_ms: now,
                    invocation: id,
                    completion: CROWDED,
                }),
            )));
        }
    }

    /// The wake-up of one an `on_full` named: unless it started, queued again or ended
    /// meanwhile, it completes never run (dropped, replaced) or is told to cancel.
    pub(super) fn end_crowded(
        &mut self,
        id: InvocationId,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
        let Some(crowded) = self.admission.crowded.remove(&id) else {
            return Ok(());
        };
        let Some(live) = self.live.get(&id) else {
            return Ok(());
        };
        if live.record().status == Status::Completed {
            return Ok(());
        }
        if crowded.out.fate == Fate::Cancel {
            if live.started() {
                self.control(id, Control::Cancel, writes, effects)?;
            }
            return Ok(());
        }
        let waiting = matches!(live.record().status, Status::Pending | Status::Scheduled);
        if !waiting || live.started() || live.run().queue().is_some() {
            return Ok(());
        }
        let retention = self.retention(&live.record().target);
        let now = self.outside.driver.now_ms();
        let live = self.live.get_mut(&id).expect("checked live");
        if live.unsaved {
            super::journal::save(live, writes)?;
        }
        let error = crowded_error(live, &crowded);
        super::ending::fail_unstarted(live, 409, &error, retention, now, writes, effects)
    }
}

/// What a dropped or replaced invocation completes with: the rule, the counter and who took
/// its place.
fn crowded_error(live: &Live, crowded: &Crowded) -> CodedError {
    let why = &crowded.out.why;
    let rule = why
        .rule
        .as_ref()
        .map_or_else(|| "-".to_owned(), ToString::to_string);
    let record = live.record();
    let counter = match (&record.scope, &record.limit_key) {
        (Some(scope), Some(key)) => format!("scope '{scope}', limit key '{key}'"),
        (Some(scope), None) => format!("scope '{scope}'"),
        _ => "its scope".to_owned(),
    };
    let at = format!(
        "the {} counter of {counter} (rule '{rule}', on_full = {})",
        why.level.as_str(),
        why.policy
    );
    match crowded.out.fate {
        Fate::Replaced => CodedError::new(
            Code::FLO0008,
            format!(
                "a newer call{} took this one's place at {at} before it started",
                crowded.by.map_or_else(String::new, |by| format!(" ({by})"))
            ),
        ),
        _ => CodedError::new(
            Code::FLO0007,
            format!("{at} was full: the call was dropped without starting"),
        ),
    }
}
