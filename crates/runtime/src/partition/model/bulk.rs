//! Bulk cancel: the invocations an operator's filter names (`POST /invocations/bulk-cancel`).
//! A partition lists its candidates once, from what it holds in memory (a query), then cancels
//! them in batches, one command each, checking every one against the whole filter again as it
//! goes: between two batches the partition serves everything else, and an invocation that
//! started or ended meanwhile is judged as it is then.

use sluice_core::ids::InvocationId;
use sluice_flow::scheduler::QueueKey;
use sluice_flow::{LimitKey, Scope};
use sluice_store::invocation::{InvocationRecord, Status};

/// Which invocations a bulk cancel names: all of its fields that are set must match.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CancelFilter {
    /// The invocation's flow-control scope.
    pub scope: Option<Scope>,
    /// Its limit key, or one under it (`gold` names `gold` and `gold/eu`).
    pub limit_key: Option<LimitKey>,
    /// Its target service.
    pub service: Option<String>,
    /// Its target handler.
    pub handler: Option<String>,
    /// Created at or after (ms since the epoch).
    pub created_from_ms: Option<u64>,
    /// Created before (ms since the epoch).
    pub created_until_ms: Option<u64>,
    /// Waiting for its first attempt: queued by flow control or behind its object's lock.
    pub pending: bool,
    /// A delayed send waiting for its time.
    pub scheduled: bool,
    /// Started and waiting for a timer, a call's result, an awakeable or a promise.
    pub suspended: bool,
}

impl CancelFilter {
    /// Whether an invocation in `status` may be named.
    pub fn names_status(&self, status: Status) -> bool {
        match status {
            Status::Pending => self.pending,
            Status::Scheduled => self.scheduled,
            Status::Suspended => self.suspended,
            _ => false,
        }
    }

    /// Whether entries of the queue of `key` may be named (its scope, limit key and service
    /// match); their handler and age are checked on their records.
    pub fn names_queue(&self, key: &QueueKey) -> bool {
        self.pending
            && self.scope_matches(key.scope.as_ref())
            && self.key_matches(key.limit_key.as_ref())
            && self.service.as_deref().is_none_or(|s| *key.service == *s)
    }

    /// Whether `record` is named.
    pub fn names(&self, record: &InvocationRecord) -> bool {
        self.names_status(record.status)
            && self.scope_matches(record.scope.as_ref())
            && self.key_matches(record.limit_key.as_ref())
            && self
                .service
                .as_deref()
                .is_none_or(|s| record.target.service == s)
            && self
                .handler
                .as_deref()
                .is_none_or(|h| record.target.handler == h)
            && self
                .created_from_ms
                .is_none_or(|from| record.created_at_ms >= from)
            && self
                .created_until_ms
                .is_none_or(|until| record.created_at_ms < until)
    }

    fn scope_matches(&self, scope: Option<&Scope>) -> bool {
        self.scope.as_ref().is_none_or(|want| scope == Some(want))
    }

    fn key_matches(&self, key: Option<&LimitKey>) -> bool {
        let Some(want) = &self.limit_key else {
            return true;
        };
        key.is_some_and(|key| {
            let (key, want) = (key.as_str(), want.as_str());
            key == want
                || key
                    .strip_prefix(want)
                    .is_some_and(|rest| rest.starts_with('/'))
        })
    }
}

/// One batch of a bulk cancel, as a partition answers it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cancelled {
    /// Invocations the filter still named (a dry run counts only these).
    pub named: u64,
    /// Of those, how many were canceled.
    pub cancelled: u64,
}

/// The invocations a batch takes: its ids, in the order the partition listed them.
pub type Batch = Vec<InvocationId>;

#[cfg(test)]
mod tests {
    use super::*;

    fn record(status: Status, scope: Option<&str>, key: Option<&str>) -> InvocationRecord {
        let target = sluice_store::invocation::Target {
            service: "Greeter".into(),
            handler: "greet".into(),
            key: None,
        };
        let mut record = InvocationRecord::new(InvocationId::generate(7), target, 1_000);
        record.status = status;
        record.scope = scope.map(|s| Scope::parse(s).unwrap());
        record.limit_key = key.map(|k| LimitKey::parse(k).unwrap());
        record
    }

    #[test]
    fn a_limit_key_names_itself_and_the_keys_under_it_only() {
        let filter = CancelFilter {
            scope: Some(Scope::parse("acme").unwrap()),
            limit_key: Some(LimitKey::parse("gold").unwrap()),
            pending: true,
            ..CancelFilter::default()
        };
        assert!(filter.names(&record(Status::Pending, Some("acme"), Some("gold"))));
        assert!(filter.names(&record(Status::Pending, Some("acme"), Some("gold/eu"))));
        assert!(!filter.names(&record(Status::Pending, Some("acme"), Some("golden"))));
        assert!(!filter.names(&record(Status::Pending, Some("acme"), None)));
        assert!(!filter.names(&record(Status::Pending, Some("other"), Some("gold"))));
    }

    #[test]
    fn statuses_handler_and_creation_time_all_have_to_match() {
        let filter = CancelFilter {
            handler: Some("greet".into()),
            created_from_ms: Some(1_000),
            created_until_ms: Some(2_000),
            scheduled: true,
            suspended: true,
            ..CancelFilter::default()
        };
        assert!(filter.names(&record(Status::Scheduled, None, None)));
        assert!(filter.names(&record(Status::Suspended, None, None)));
        assert!(!filter.names(&record(Status::Pending, None, None)));
        assert!(!filter.names(&record(Status::Running, None, None)));
        let mut late = record(Status::Scheduled, None, None);
        late.created_at_ms = 2_000;
        assert!(!filter.names(&late));
        let mut other = record(Status::Scheduled, None, None);
        other.target.handler = "other".into();
        assert!(!filter.names(&other));
    }
}
