//! Invocations that wait without an attempt — suspended, backing off, paused — keep no journal
//! in memory: a suspension or a pause may last days, a back-off up to a day, and a client that
//! sends large inputs to handlers that suspend or fail would otherwise pin them all. Once every
//! batch this partition applied is committed, the journals of the invocations that came to
//! wait meanwhile are dropped from memory (the store has every entry); what arrives for them later
//! is appended after the resting entries, and the whole journal is read back the moment
//! anything needs it (an attempt, a completion or signal to check for repeats, a cancel that
//! looks for children).

use super::model::events::Event;
use super::task::Partition;
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::InvocationId;
use sluice_store::invocation::Status;
use sluice_store::invocation::store;

impl Partition {
    /// Drops from memory the journals of invocations that came to wait (suspended, backing
    /// off, paused) since the last call and still wait. Call only when every applied batch is
    /// committed: the store then holds every entry in memory.
    pub(super) fn rest_journals(&mut self) {
        for id in std::mem::take(&mut self.journals_to_rest) {
            let Some(live) = self.live.get_mut(&id) else {
                continue;
            };
            if live.running()
                || live.unsaved
                || !matches!(
                    live.record().status,
                    Status::Suspended | Status::BackingOff | Status::Paused
                )
                || live.journal.is_empty()
            {
                continue;
            }
            let kept = u32::try_from(live.journal.len()).unwrap_or(u32::MAX);
            live.rested = live.rested.saturating_add(kept);
            live.journal = Vec::new();
        }
    }

    /// Reads back the resting part of `id`'s journal, if any, ahead of what came since.
    pub(super) fn wake_journal(&mut self, id: InvocationId) -> Result<(), CodedError> {
        let Some(rested) = self.live.get(&id).map(|live| live.rested) else {
            return Ok(());
        };
        if rested == 0 {
            return Ok(());
        }
        let mut journal = self
            .outside
            .store
            .with_db(|db| store::load_journal_prefix(db, id, rested))??;
        if journal.len() != rested as usize {
            return Err(CodedError::new(
                Code::STO0002,
                format!(
                    "invocation {id} rested with {rested} journal entries but the store has {}",
                    journal.len()
                ),
            ));
        }
        let live = self.live.get_mut(&id).expect("checked above");
        journal.append(&mut live.journal);
        live.journal = journal;
        live.rested = 0;
        // Still waiting after what woke it (a signal it does not await): back to rest.
        self.journals_to_rest.push(id);
        Ok(())
    }

    /// Reads back the journal of the invocation `event` changes, if it rests. A wait for its
    /// outcome or a peek reads nothing of it.
    pub(super) fn wake_journal_for(&mut self, event: &Event) -> Result<(), CodedError> {
        if matches!(event, Event::Await { .. } | Event::Peek { .. }) {
            return Ok(());
        }
        match event.invocation() {
            Some(id) => self.wake_journal(id),
            None => Ok(()),
        }
    }
}
