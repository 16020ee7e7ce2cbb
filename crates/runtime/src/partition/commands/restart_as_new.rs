//! Restart as new: a completed invocation's journal prefix becomes a new invocation
//! ([`crate::partition::model::restart::journal_prefix`]), stored with its batch; an id that exists
//! already is answered "not created".

use tokio::sync::oneshot;

use super::super::model::effect::Effect;
use super::super::task::Partition;
use sluice_core::errors::CodedError;
use sluice_protocol::Frame;
use sluice_store::invocation::InvocationRecord;
use sluice_store::storage::writer::WriteSet;

impl Partition {
    pub(in super::super) fn restart_as_new(
        &mut self,
        record: Box<InvocationRecord>,
        journal: Vec<Frame>,
        reply: oneshot::Sender<Result<bool, CodedError>>,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
        let id = record.id;
        if self.live.contains_key(&id) || self.stored(id)?.is_some() {
            effects.push(Effect::Ack(reply, false));
            return Ok(());
        }
        self.create(*record, journal, false, None, writes, effects)?;
        effects.push(Effect::Ack(reply, true));
        Ok(())
    }
}
