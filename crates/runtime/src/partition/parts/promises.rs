//! The partition's promises part: completed promises it saw (reads must see completions still
//! committing) and the invocations waiting on open ones. What the partition does with them —
//! promise commands, waking waiters — is `workflow_promises.rs`.

use std::collections::HashMap;

use crate::partition::model::effect::PromiseKey;
use sluice_core::ids::InvocationId;
use sluice_store::invocation::state::Promise;

/// Completed promises seen by this partition (reads must see completions still committing)
/// and the invocations waiting on open ones.
#[derive(Debug, Default)]
pub struct Promises {
    completed: HashMap<PromiseKey, Promise>,
    waiters: HashMap<PromiseKey, Vec<(InvocationId, u32)>>,
}

impl Promises {
    /// The promise `key` if it completed here and its completion is still committing.
    pub(in crate::partition) fn completed(&self, key: &PromiseKey) -> Option<Promise> {
        self.completed.get(key).cloned()
    }

    /// Keeps `promise`, completed now, until its completion is committed.
    pub(in crate::partition) fn complete(&mut self, key: PromiseKey, promise: Promise) {
        self.completed.insert(key, promise);
    }

    /// The completion of `key` is committed: later reads find it in the store.
    pub(in crate::partition) fn uncache(&mut self, key: &PromiseKey) {
        self.completed.remove(key);
    }

    /// Forgets the completions kept of the workflow `service` with `key` (its state is
    /// cleared).
    pub(in crate::partition) fn forget(&mut self, service: &str, key: &str) {
        self.completed
            .retain(|(s, k, _), _| !(s == service && k == key));
    }

    /// Attempt `completion` of invocation `id` waits for `key`.
    pub(in crate::partition) fn wait(
        &mut self,
        key: PromiseKey,
        id: InvocationId,
        completion: u32,
    ) {
        self.waiters.entry(key).or_default().push((id, completion));
    }

    /// Everyone waiting for `key`, who waits no more.
    pub(in crate::partition) fn take_waiters(
        &mut self,
        key: &PromiseKey,
    ) -> Vec<(InvocationId, u32)> {
        self.waiters.remove(key).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> PromiseKey {
        ("Wf".into(), "k".into(), "p".into())
    }

    #[test]
    fn a_completion_is_seen_until_uncached_and_waiters_are_taken_once() {
        let mut promises = Promises::default();
        let id = InvocationId::new(0, 7);
        promises.wait(key(), id, 3);
        promises.complete(key(), Promise::Value("v".into()));
        assert_eq!(promises.completed(&key()), Some(Promise::Value("v".into())));
        assert_eq!(promises.take_waiters(&key()), [(id, 3)]);
        assert!(promises.take_waiters(&key()).is_empty());
        promises.uncache(&key());
        assert_eq!(promises.completed(&key()), None);
    }
}
