//! The partition's commands, one handler each. Every [`Event`] that changes something is a
//! command; [`Partition::apply`] routes it to its handler, which reads and changes only what
//! its command touches, adds the writes to the batch's write set and returns what must happen
//! once the batch is stored as [`Effect`]s (plain data, executed by `Partition::run_effects`).
//!
//! | command | handler | touches |
//! |---|---|---|
//! | `Submit` | `submit.rs` | the invocation map, held limits, the scheduler's refusals |
//! | `Restart` (as new) | `restart_as_new.rs` | the invocation map |
//! | `Await` (attach) | `attach.rs` | one invocation's waiters (live or at rest) |
//! | `Peek` | `peek.rs` | nothing (reads) |
//! | `SetObjectState` | `object_state.rs` | the write set only |
//! | `PauseQueue` | `queue_pause.rs` | one scheduler queue |
//! | `ResetQuota` | `reset_quota.rs` | the quota counts a pattern matches |
//! | `AttemptMessage` | `attempt_message.rs` | one invocation (and its workflow's promises) |
//! | `AttemptAnswered` | `attempt_message.rs` | its deployment's paced drain |
//! | `AttemptDone` | `attempt_end.rs` | one invocation |
//! | `Wake` | `wake.rs` | one invocation (an expiry: its record and promises) |
//! | `CallResult` | `call_result.rs` | one invocation |
//! | `Signal` | `signal.rs` | one invocation |
//! | `Control` | `control.rs` | one invocation and the ones it called |
//! | `CancelBatch` | `bulk_cancel.rs` | the invocations of its batch that its filter names |
//! | `SlotsFree`, `Barrier` | here | nothing: a dispatch, an answer after the commit |
//!
//! A command that reads or changes one or two parts is a function over exactly those parts,
//! lent where it is dispatched (`Peek`: the invocation maps and the store; `PauseQueue` and
//! `ResetQuota`: the scheduler; `CallResult`: one invocation; `SetObjectState`: the write set
//! alone), so its signature says all it can touch. The others start, end, wake or move
//! invocations across the partition's parts (the invocation maps, the scheduler, the resting
//! form, the wake-ups, the promises) and are `Partition` methods.
//!
//! Reads (queued entries, locks, queues, counters, why one waits) are not commands: they come
//! on their own channel (`queries.rs`).

mod attach;
mod attempt_end;
mod attempt_message;
mod bulk_cancel;
mod call_result;
mod control;
#[cfg(test)]
mod fixtures;
mod object_state;
mod peek;
mod queue_pause;
mod reset_quota;
mod restart_as_new;
mod signal;
mod submit;
mod wake;

pub(super) use wake::{EXPIRY, QUEUE_DEADLINE};

use super::journal::save;
use super::model::answer::Answer;
use super::model::effect::Effect;
use super::model::events::Event;
use super::task::Partition;
use sluice_core::errors::CodedError;
use sluice_store::storage::writer::WriteSet;

impl Partition {
    /// Applies one command: its writes join `writes`, what must follow its commit joins
    /// `effects`. An error fails the whole batch (nothing of it is acknowledged).
    pub(super) fn apply(
        &mut self,
        event: Event,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
        let before = effects.len();
        let applied = self.apply_event(event, writes, effects);
        // What the calls that ended spent goes in the set that holds their ends.
        self.charge_ended(&effects[before..], writes);
        applied
    }

    fn apply_event(
        &mut self,
        event: Event,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
        self.rouse_for(&event);
        self.observe();
        self.wake_journal_for(&event)?;
        // Whatever an operator, a signal, a timer or a callee does to an invocation that was
        // never stored depends on it: it is stored first, in the same write set.
        if matches!(
            event,
            Event::Control { .. }
                | Event::Signal { .. }
                | Event::Wake { .. }
                | Event::CallResult { .. }
        ) && let Some(live) = event.invocation().and_then(|id| self.live.get_mut(&id))
            && live.unsaved
        {
            save(live, writes)?;
        }
        match event {
            Event::Submit {
                record,
                input,
                reply,
                call,
            } => self.submit(record, input, reply, call, writes, effects)?,
            Event::Restart {
                record,
                journal,
                reply,
            } => self.restart_as_new(record, journal, reply, writes, effects)?,
            Event::Await { id, reply } => self.attach(id, reply, effects)?,
            Event::Peek { id, output, reply } => peek::peek(
                &self.live,
                &self.resting,
                &self.outside.store,
                id,
                output,
                reply,
                effects,
            )?,
            Event::SetObjectState {
                service,
                key,
                state,
                reply,
            } => effects.push(object_state::set_object_state(
                &service, &key, &state, reply, writes,
            )),
            Event::PauseQueue {
                queue,
                pause,
                reply,
            } => queue_pause::pause_queue(
                &self.admission.scheduler,
                self.outside.index,
                queue,
                pause,
                reply,
                writes,
                effects,
            ),
            Event::ResetQuota {
                measure,
                pattern,
                reply,
            } => reset_quota::reset_quota(
                &self.admission.scheduler,
                self.outside.index,
                measure,
                pattern,
                reply,
                writes,
                effects,
            ),
            Event::AttemptMessage {
                id,
                attempt,
                message,
                ack,
            } => self.attempt_message(id, attempt, message, ack, writes, effects)?,
            Event::AttemptAnswered { id, attempt } => self.attempt_answered(id, attempt),
            Event::AttemptDone {
                id,
                attempt,
                result,
            } => {
                if self.attempt_done(id, attempt, result, writes, effects)? {
                    // Only once this batch is durable may the next holder of the object's
                    // lock start: it reads the state this attempt wrote.
                    effects.push(Effect::Settle(id));
                }
            }
            Event::Wake { id, completion } => self.wake(id, completion, writes, effects)?,
            Event::CallResult {
                id,
                completion,
                outcome,
            } => {
                if let Some(live) = self.live.get_mut(&id) {
                    call_result::call_result(live, completion, outcome, writes, effects);
                }
            }
            Event::Signal { signal, reply } => {
                let delivery = self.signal(signal, writes, effects);
                if let Some(reply) = reply {
                    effects.push(Effect::Answer(Answer::Signalled(reply, delivery)));
                }
            }
            Event::Control { id, op, reply } => {
                let answer = self.control(id, op, writes, effects)?;
                effects.push(Effect::Answer(Answer::Controlled(reply, answer)));
            }
            Event::CancelBatch {
                filter,
                batch,
                dry_run,
                reply,
            } => {
                let done = self.cancel_batch(&filter, batch, dry_run, writes, effects)?;
                effects.push(Effect::Answer(Answer::BulkCancelled(reply, done)));
            }
            // The batch's effects end with a dispatch, which takes the freed slots.
            Event::SlotsFree => {}
            Event::Barrier { reply } => effects.push(Effect::Answer(Answer::Barrier(reply))),
        }
        Ok(())
    }
}

#[cfg(test)]
mod table_tests {
    /// The variants of `Event`, read from its source: the names a command table must list.
    fn event_variants() -> Vec<String> {
        let source = include_str!("../model/events.rs");
        let body = source
            .split_once("pub enum Event {")
            .expect("events.rs declares `pub enum Event`")
            .1;
        let body = &body[..body.find("\n}\n").expect("the enum ends")];
        body.lines()
            .filter_map(|line| line.strip_prefix("    "))
            .filter_map(|line| {
                let name: String = line
                    .chars()
                    .take_while(char::is_ascii_alphanumeric)
                    .collect();
                name.starts_with(|c: char| c.is_ascii_uppercase())
                    .then_some(name)
            })
            .collect()
    }

    /// The rows of the command table in `text` (the table under `| command | handler |`, each
    /// line behind `prefix`): each row's command names (in backticks in its first cell) and its
    /// handler file (second cell).
    fn table_rows(text: &str, prefix: &str) -> Vec<(Vec<String>, String)> {
        text.lines()
            .map(|line| line.strip_prefix(prefix).unwrap_or(""))
            .skip_while(|line| !line.starts_with("| command | handler |"))
            .skip(2)
            .take_while(|line| line.starts_with('|'))
            .filter_map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                let names = cells.get(1)?.split('`').skip(1).step_by(2);
                let handler = cells.get(2)?.trim_matches('`').to_owned();
                Some((names.map(str::to_owned).collect(), handler))
            })
            .collect()
    }

    #[test]
    fn every_event_is_a_row_of_both_command_tables_and_its_handler_file_exists() {
        let variants = event_variants();
        assert!(variants.len() >= 10, "read the enum: {variants:?}");
        let docs = include_str!("../../../../../docs/partition.md");
        let here = include_str!("mod.rs");
        for (name, text, prefix, dir) in [
            ("docs/partition.md", docs, "", "src/partition/"),
            ("commands/mod.rs", here, "//! ", "src/partition/commands/"),
        ] {
            let rows = table_rows(text, prefix);
            for variant in &variants {
                assert!(
                    rows.iter().any(|(names, _)| names.contains(variant)),
                    "`{variant}` has no row in {name}'s command table"
                );
            }
            for (names, handler) in &rows {
                for listed in names {
                    assert!(
                        variants.contains(listed),
                        "{name} lists `{listed}`, which is not an `Event`"
                    );
                }
                if handler != "here" {
                    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join(dir)
                        .join(handler);
                    assert!(path.exists(), "{name}: {} does not exist", path.display());
                }
            }
        }
    }
}
