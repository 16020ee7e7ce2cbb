//! How an invocation is born. The ingress, a handler's call and a Kafka record all describe the
//! invocation they want as a [`NewInvocation`]; this module alone turns that into its id and its
//! record, so the three agree on ids, on where an invocation lives, and on the scope and limit
//! key that are stored, counted, shown and handed to the handler (the normalised ones).

use std::time::Duration;

use super::identity::{idempotent_id, in_scope, partition_key, target_partition_key};
use super::{Caller, InvocationRecord, Status, Target};
use sluice_core::ids::InvocationId;
use sluice_flow::{LimitKey, Priority, Scope};

/// What makes the invocation's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A new random id: every request is a new invocation.
    Fresh,
    /// The invocation this idempotency key stands for (with the scope and target).
    Idempotent(String),
    /// The run of a workflow: its key names it.
    WorkflowRun,
    /// An id that repeats for the same source, so a source handed in again finds its
    /// invocation: a caller's call command, a Kafka record. `partition` overrides the target's
    /// partition key (an unkeyed Kafka record spreads by its coordinates).
    Derived { uuid: u128, partition: Option<u64> },
}

/// A partition chosen for a new invocation that may live on any: `index` of `partitions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// The partition's index.
    pub index: u32,
    /// How many partitions there are.
    pub partitions: u32,
}

/// An invocation someone asked for, not yet stored.
#[derive(Debug, Clone)]
pub struct NewInvocation {
    pub target: Target,
    pub identity: Identity,
    /// Under flow control: its scope and limit key, already validated and normalised.
    pub scope: Option<Scope>,
    pub limit_key: Option<LimitKey>,
    /// Not before this time, ms since the epoch (a delayed send); it waits as scheduled.
    pub run_at_ms: Option<u64>,
    /// The invocation waiting for its result.
    pub caller: Option<Caller>,
    /// How long its result is kept once completed (idempotent invocations, workflow runs).
    pub retention: Option<Duration>,
    /// Its priority among waiters of a flow-control counter (`None`: normal).
    pub priority: Option<Priority>,
    /// The trace its spans join.
    pub trace: Option<sluice_core::trace::TraceParent>,
    /// Its request's deadline, ms since the epoch.
    pub deadline_ms: Option<u64>,
}

/// The id of `uuid` for `target`: on `partition` when given; else an object's invocations stay
/// on its partition and unkeyed work spreads over the partitions by its uuid.
fn placed(target: &Target, uuid: u128, partition: Option<u64>) -> InvocationId {
    match (partition, target.key.as_deref()) {
        (Some(partition), _) => InvocationId::new(partition, uuid),
        (None, None) => InvocationId::spread(uuid),
        (None, Some(_)) => InvocationId::new(
            target_partition_key(&target.service, &target.handler, target.key.as_deref()),
            uuid,
        ),
    }
}

impl NewInvocation {
    /// An unscoped invocation of `target`, to run now, with nobody waiting on it.
    pub fn new(target: Target, identity: Identity) -> Self {
        Self {
            target,
            identity,
            scope: None,
            limit_key: None,
            run_at_ms: None,
            caller: None,
            retention: None,
            priority: None,
            trace: None,
            deadline_ms: None,
        }
    }

    /// Dropped with FLO0003 if it has not started by `deadline_ms` (ms since the epoch).
    pub fn with_deadline(mut self, deadline_ms: Option<u64>) -> Self {
        self.deadline_ms = deadline_ms;
        self
    }

    /// Its spans join `trace`.
    pub fn with_trace(mut self, trace: Option<sluice_core::trace::TraceParent>) -> Self {
        self.trace = trace;
        self
    }

    /// With `priority` among the waiters of its counters (only counts under a scope).
    pub fn with_priority(mut self, priority: Option<Priority>) -> Self {
        self.priority = priority;
        self
    }

    /// Under `scope` (and `limit_key`, which only counts under a scope).
    pub fn in_scope(mut self, scope: Option<Scope>, limit_key: Option<LimitKey>) -> Self {
        self.limit_key = scope.as_ref().and(limit_key);
        self.scope = scope;
        self
    }

    /// Its id (a fresh one differs each time: take it from the record). A fresh unkeyed,
    /// unscoped invocation may live on any partition: on `place` when given (cluster mode: one
    /// this node leads), made for it rather than drawn until one fits.
    fn id(&self, place: Option<Place>) -> InvocationId {
        let target = &self.target;
        let scope = self.scope.as_ref().map(Scope::as_str);
        let id = match &self.identity {
            Identity::Fresh => {
                let uuid = InvocationId::new_uuid();
                match place {
                    Some(place) if target.key.is_none() && scope.is_none() => {
                        InvocationId::spread_onto(
                            uuid,
                            u64::from(place.index),
                            u64::from(place.partitions),
                        )
                    }
                    _ => placed(target, uuid, None),
                }
            }
            Identity::Idempotent(key) => idempotent_id(
                scope,
                &target.service,
                target.key.as_deref(),
                &target.handler,
                key,
            ),
            Identity::WorkflowRun => {
                let key = target.key.as_deref().unwrap_or_default();
                InvocationId::workflow_run(
                    partition_key(&[&target.service, key]),
                    scope,
                    &target.service,
                    key,
                )
            }
            Identity::Derived { uuid, partition } => placed(target, *uuid, *partition),
        };
        in_scope(id, scope)
    }

    /// Its record, created at `now`.
    pub fn into_record(self, now: u64) -> InvocationRecord {
        self.into_record_on(now, None)
    }

    /// Its record, created at `now`; a fresh id that may live anywhere is made for `place`.
    pub fn into_record_on(self, now: u64, place: Option<Place>) -> InvocationRecord {
        let mut record = InvocationRecord::new(self.id(place), self.target, now);
        if let Some(at) = self.run_at_ms {
            record.status = Status::Scheduled;
            record.run_at_ms = Some(at);
        }
        record.priority = self.scope.as_ref().and(self.priority);
        record.trace = self.trace.map(|t| t.to_string());
        record.deadline_ms = self.deadline_ms;
        record.scope = self.scope;
        record.limit_key = self.limit_key;
        if let Identity::Idempotent(key) = self.identity {
            record.idempotency_key = Some(key);
        }
        record.caller = self.caller;
        record.retention_ms = self
            .retention
            .map(|r| u64::try_from(r.as_millis()).unwrap_or(u64::MAX));
        record
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(key: Option<&str>) -> Target {
        Target {
            service: "Counter".into(),
            handler: "add".into(),
            key: key.map(str::to_owned),
        }
    }

    #[test]
    fn the_normalised_scope_and_key_are_stored() {
        let (scope, key) = sluice_flow::scope::parse_request(Some("acme"), Some("gold/")).unwrap();
        let record = NewInvocation::new(target(None), Identity::Fresh)
            .in_scope(scope, key)
            .into_record(7);
        assert_eq!(record.scope.as_ref().map(Scope::as_str), Some("acme"));
        assert_eq!(
            record.limit_key.as_ref().map(LimitKey::as_str),
            Some("gold")
        );
        assert_eq!(record.created_at_ms, 7);
        assert_eq!(record.id.partition_key(), partition_key(&["acme"]));
    }

    #[test]
    fn a_limit_key_without_a_scope_is_dropped() {
        let key = LimitKey::parse("gold").unwrap();
        let record = NewInvocation::new(target(None), Identity::Fresh)
            .in_scope(None, Some(key))
            .into_record(0);
        assert_eq!((record.scope, record.limit_key), (None, None));
    }

    #[test]
    fn repeatable_identities_give_the_same_id() {
        let idempotent = || {
            NewInvocation::new(target(Some("k")), Identity::Idempotent("ik".into())).into_record(0)
        };
        assert_eq!(idempotent().id, idempotent().id);
        assert_eq!(idempotent().idempotency_key.as_deref(), Some("ik"));
        assert_eq!(
            idempotent().id.partition_key(),
            partition_key(&["Counter", "k"])
        );
        let derived = |partition| {
            NewInvocation::new(
                target(None),
                Identity::Derived {
                    uuid: 42,
                    partition,
                },
            )
            .into_record(0)
            .id
        };
        assert_eq!(derived(Some(9)), InvocationId::new(9, 42));
        // Unkeyed: spread by the uuid, the same each time it is derived.
        assert_eq!(derived(None), InvocationId::spread(42));
        assert_eq!(derived(None), derived(None));
        let fresh = |key| {
            NewInvocation::new(target(key), Identity::Fresh)
                .into_record(0)
                .id
        };
        assert_ne!(fresh(None), fresh(None));
        // One handler's fresh calls land on many partitions; an object's stay on its own.
        let partitions: std::collections::HashSet<u64> =
            (0..64).map(|_| fresh(None).partition_key() % 8).collect();
        assert!(partitions.len() > 4, "{partitions:?}");
        // Their store keys follow time: the partition key starts with the ULID's milliseconds.
        let id = fresh(None);
        assert_eq!(id.partition_key() >> 16, (id.uuid() >> 80) as u64);
        // Placed: on the partition chosen, every time; an object's call is never moved.
        let place = Place {
            index: 5,
            partitions: 8,
        };
        for _ in 0..64 {
            let id = NewInvocation::new(target(None), Identity::Fresh)
                .into_record_on(0, Some(place))
                .id;
            assert_eq!(id.partition_key() % 8, 5);
        }
        assert_eq!(
            NewInvocation::new(target(Some("k")), Identity::Fresh)
                .into_record_on(0, Some(place))
                .id
                .partition_key(),
            partition_key(&["Counter", "k"])
        );
        assert_eq!(
            fresh(Some("k")).partition_key(),
            partition_key(&["Counter", "k"])
        );
    }

    #[test]
    fn a_delayed_one_waits_as_scheduled_and_keeps_its_retention() {
        let mut new = NewInvocation::new(target(None), Identity::Fresh);
        new.run_at_ms = Some(5_000);
        new.retention = Some(Duration::from_secs(2));
        let record = new.into_record(1_000);
        assert_eq!(record.status, Status::Scheduled);
        assert_eq!(record.run_at_ms, Some(5_000));
        assert_eq!(record.retention_ms, Some(2_000));
    }
}
