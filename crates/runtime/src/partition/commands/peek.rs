//! Peek: where an invocation is, without waiting: its target and outcome, answered after the
//! commit of what came before (the outcome may belong to a batch still committing). An
//! invocation at rest stays at rest.

use tokio::sync::oneshot;

use std::collections::HashMap;

use super::super::live::Live;
use super::super::model::answer::Answer;
use super::super::model::answer::Peek;
use super::super::model::effect::Effect;
use super::super::parts::resting::Resting;
use sluice_core::errors::CodedError;
use sluice_core::ids::InvocationId;
use sluice_store::invocation::store;
use sluice_store::invocation::{Outcome, OutcomeKind};
use sluice_store::storage::Store;

/// Where `id` is: in memory (`live`), at rest (`dormant`), or only in `store`.
pub(super) fn peek(
    live: &HashMap<InvocationId, Box<Live>>,
    resting: &Resting,
    store: &Store,
    id: InvocationId,
    output: bool,
    reply: oneshot::Sender<Option<Peek>>,
    effects: &mut Vec<Effect>,
) -> Result<(), CodedError> {
    let in_memory = match (live.get(&id), resting.peek(&id)) {
        (Some(live), _) => Some(Peek {
            target: live.record().target.clone(),
            status: live.record().status,
            outcome: live.record().outcome.as_ref().map(|o| match o {
                Outcome::Value(_) if !output => Outcome::Value(Vec::new()),
                other => other.clone(),
            }),
            scope: live.record().scope.as_ref().map(|s| s.as_str().to_owned()),
        }),
        // At rest: never ran, no outcome; it stays at rest. One whose record rests in the
        // store alone is read there like any record not in memory.
        (None, Some(resting)) => resting.peek(),
        (None, None) => None,
    };
    let seen = match in_memory {
        Some(peek) => Some(peek),
        None if output => store
            .with_db(|db| store::load_record(db, id))??
            .map(|r| Peek {
                target: r.target,
                status: r.status,
                outcome: r.outcome,
                scope: r.scope.map(|s| s.as_str().to_owned()),
            }),
        // The record without its output: the value's bytes are skipped while decoding.
        None => store
            .with_db(|db| store::load_listed_one(db, id))??
            .map(|r| Peek {
                target: r.target,
                status: r.status,
                outcome: r.outcome.map(|o| match o {
                    OutcomeKind::Value(_) => Outcome::Value(Vec::new()),
                    OutcomeKind::Failure(f) => Outcome::Failure(f),
                }),
                scope: r.scope.map(|s| s.as_str().to_owned()),
            }),
    };
    effects.push(Effect::Answer(Answer::Peeked(reply, seen)));
    Ok(())
}
