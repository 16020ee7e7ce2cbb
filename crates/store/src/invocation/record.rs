//! What Sluice keeps about an invocation between attempts.

use serde::{Deserialize, Serialize};

use sluice_core::errors::Code;
use sluice_core::ids::{DeploymentId, InvocationId};
use sluice_flow::{LimitKey, Priority, Scope};

/// Where an invocation goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// Service name.
    pub service: String,
    /// Handler name.
    pub handler: String,
    /// Object or workflow key.
    pub key: Option<String>,
}

impl Target {
    /// How people read it: `Service/handler`, or `Service/key/handler` for keyed services.
    pub fn path(&self) -> String {
        match &self.key {
            Some(key) => format!("{}/{key}/{}", self.service, self.handler),
            None => format!("{}/{}", self.service, self.handler),
        }
    }
}

/// Lifecycle of an invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Accepted, not started.
    Pending,
    /// Waiting for its run time (delayed send).
    Scheduled,
    /// An attempt is running.
    Running,
    /// Waiting for a completion (timer, run result).
    Suspended,
    /// Failed; the next attempt waits for its back-off.
    BackingOff,
    /// Out of attempts; an operator resumes it.
    Paused,
    /// Finished with an output or a failure.
    Completed,
}

impl Status {
    /// Its name as the admin API and SQL show it (`backing-off`): the stored spelling.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Scheduled => "scheduled",
            Self::Running => "running",
            Self::Suspended => "suspended",
            Self::BackingOff => "backing-off",
            Self::Paused => "paused",
            Self::Completed => "completed",
        }
    }
}

/// A handler failure returned to callers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// HTTP-like code (e.g. 500, 418).
    pub code: u16,
    /// What went wrong.
    pub message: String,
}

/// The result of a completed invocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// The output bytes (stored as bytes, never as a list of numbers).
    Value(#[serde(with = "serde_bytes")] Vec<u8>),
    /// A terminal failure.
    Failure(Failure),
}

impl Outcome {
    /// One line for people: `value`, or `failure <code>: <message>`.
    pub fn summary(&self) -> String {
        match self {
            Self::Value(_) => "value".to_owned(),
            Self::Failure(f) => format!("failure {}: {}", f.code, f.message),
        }
    }
}

/// The last thing that went wrong with an attempt.
/// An outcome without its value's bytes: what a list shows of it. Decodes from a stored
/// [`Outcome`], skipping the bytes.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub enum OutcomeKind {
    Value(serde::de::IgnoredAny),
    Failure(Failure),
}

/// What a list says of an outcome.
pub trait Summary {
    /// `value`, or `failure <code>: <message>`.
    fn summary(&self) -> String;
}

impl Summary for Outcome {
    fn summary(&self) -> String {
        Outcome::summary(self)
    }
}

impl Summary for OutcomeKind {
    fn summary(&self) -> String {
        match self {
            Self::Value(_) => "value".to_owned(),
            Self::Failure(f) => format!("failure {}: {}", f.code, f.message),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastFailure {
    /// Catalogue code.
    pub code: Option<String>,
    /// Message.
    pub message: String,
}

impl LastFailure {
    /// From a code and message.
    pub fn new(code: Option<Code>, message: impl Into<String>) -> Self {
        Self {
            code: code.map(|c| c.as_str().to_owned()),
            message: message.into(),
        }
    }
}

/// An invocation as stored.
pub type InvocationRecord = RecordOf<Outcome>;

/// An invocation as a list shows it: its outcome's kind and failure, never its output bytes
/// (skipped while decoding, not read into memory).
pub type ListedRecord = RecordOf<OutcomeKind>;

/// An invocation's record, with its outcome as `O`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordOf<O> {
    /// Its id.
    pub id: InvocationId,
    /// Where it goes.
    pub target: Target,
    /// Where it is.
    pub status: Status,
    /// Deployment pinned at the first attempt.
    pub deployment: Option<DeploymentId>,
    /// Protocol version pinned at the first attempt.
    pub protocol: Option<i32>,
    /// Attempts made so far.
    pub attempts: u32,
    /// Failed attempts since the last progress.
    pub retry_count: u32,
    /// Not before this time (delayed sends, back-off), ms since the epoch.
    pub run_at_ms: Option<u64>,
    /// The last failure.
    pub last_failure: Option<LastFailure>,
    /// The result, once completed.
    pub outcome: Option<O>,
    /// Seed for the SDK's deterministic random.
    pub random_seed: u64,
    /// Creation time, ms since the epoch.
    pub created_at_ms: u64,
    /// The invocation waiting for this one's result (a call from another handler).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<Caller>,
    /// Flow-control scope (scoped invocations only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
    /// Limit key under the scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_key: Option<LimitKey>,
    /// Idempotency key it was created with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// How long its result is kept once completed (then it is purged and its idempotency key
    /// is free again), ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_ms: Option<u64>,
    /// Its priority among the waiters of a flow-control counter (`normal` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    /// The W3C `traceparent` its spans continue (the ingress request's span), canonical text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// Its request's deadline (`x-request-deadline`, `grpc-timeout`), ms since the epoch: not
    /// started by then, it is dropped with FLO0003.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// What it spent, in the units its handler reports (the results of its `ctx.run` steps
    /// named `sluice:cost`, summed): set with its completion, in the same write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
    /// Set while it is a debounced call waiting for its run (a rule's `debounce`): the burst it
    /// belongs to, so a restart finds the burst a new call joins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debounce: Option<Box<Debounced>>,
}

/// The burst of debounced calls an invocation waits for as its run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Debounced {
    /// What groups its calls: the counter (`scope`, `scope/l1`, `scope/l1/l2`) and the
    /// target.
    pub key: String,
    /// When the burst's first call came, ms since the epoch (its `max` counts from there).
    pub since_ms: u64,
}

/// Where a called invocation's result goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caller {
    /// The calling invocation.
    pub id: InvocationId,
    /// The completion id its Call command waits on.
    pub completion: u32,
}

impl ListedRecord {
    /// A record from its stored bytes, without its output.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        crate::encoding::decode(bytes)
    }
}

impl InvocationRecord {
    /// Bytes its fields hold on the heap (names, keys, the outcome, the last failure): with
    /// `size_of::<InvocationRecord>()`, what it takes in memory.
    pub fn heap_bytes(&self) -> usize {
        let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
        let outcome = match &self.outcome {
            Some(Outcome::Value(bytes)) => bytes.len(),
            Some(Outcome::Failure(f)) => f.message.len(),
            None => 0,
        };
        let failure = self.last_failure.as_ref().map_or(0, |f| {
            f.message.len() + f.code.as_ref().map_or(0, String::len)
        });
        self.target.service.len()
            + self.target.handler.len()
            + text(&self.target.key)
            + outcome
            + failure
            + self.scope.as_ref().map_or(0, |s| s.as_str().len())
            + self.limit_key.as_ref().map_or(0, |k| k.as_str().len())
            + text(&self.idempotency_key)
            + text(&self.trace)
            + self
                .debounce
                .as_ref()
                .map_or(0, |d| std::mem::size_of::<Debounced>() + d.key.len())
    }

    /// The record's stored bytes ([`crate::encoding`]).
    pub fn encode(&self) -> Vec<u8> {
        crate::encoding::encode(self).expect("a record always encodes")
    }

    /// A record from its stored bytes, including JSON written by earlier versions.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        crate::encoding::decode(bytes)
    }

    /// The random seed an invocation starts with, derived from its id.
    pub fn seed_of(id: InvocationId) -> u64 {
        u64::from_le_bytes(id.uuid().to_le_bytes()[..8].try_into().expect("8 bytes"))
    }

    /// A new pending invocation.
    pub fn new(id: InvocationId, target: Target, created_at_ms: u64) -> Self {
        Self {
            id,
            target,
            status: Status::Pending,
            deployment: None,
            protocol: None,
            attempts: 0,
            retry_count: 0,
            run_at_ms: None,
            last_failure: None,
            outcome: None,
            random_seed: Self::seed_of(id),
            created_at_ms,
            caller: None,
            scope: None,
            limit_key: None,
            idempotency_key: None,
            retention_ms: None,
            priority: None,
            trace: None,
            deadline_ms: None,
            cost: None,
            debounce: None,
        }
    }
}

#[cfg(test)]
mod shown_tests {
    use super::*;

    /// The stored record keeps output bytes as bytes: its size is the output's plus a little,
    /// and the output is there as one run of bytes (no list of numbers anywhere).
    fn record(key: Option<&str>) -> InvocationRecord {
        InvocationRecord::new(
            sluice_core::ids::InvocationId::generate(3),
            Target {
                service: "S".into(),
                handler: "h".into(),
                key: key.map(str::to_owned),
            },
            5,
        )
    }

    #[test]
    fn outcomes_are_stored_as_bytes() {
        let mut record = record(Some("k"));
        let output: Vec<u8> = (0..2_500_000u32).map(|i| (i % 253) as u8).collect();
        record.outcome = Some(Outcome::Value(output.clone()));
        record.status = Status::Completed;
        let bytes = record.encode();
        assert!(bytes.len() < output.len() + 512, "{} bytes", bytes.len());
        assert!(bytes.windows(output.len()).any(|w| w == output.as_slice()));
        assert_eq!(InvocationRecord::decode(&bytes).unwrap(), record);
    }

    /// Records written before MessagePack (JSON, output as a list of numbers) still read.
    #[test]
    fn json_records_from_before_still_read() {
        let mut record = record(None);
        record.outcome = Some(Outcome::Value(vec![1, 2, 255]));
        let json = serde_json::to_vec(&record).unwrap();
        assert!(String::from_utf8_lossy(&json).contains("[1,2,255]"));
        assert_eq!(InvocationRecord::decode(&json).unwrap(), record);
        assert!(InvocationRecord::decode(b"\xc1").is_err());
        assert!(InvocationRecord::decode(b"").is_err());
    }

    #[test]
    fn status_names_are_the_stored_spelling() {
        for status in [
            Status::Pending,
            Status::Scheduled,
            Status::Running,
            Status::Suspended,
            Status::BackingOff,
            Status::Paused,
            Status::Completed,
        ] {
            assert_eq!(
                serde_json::to_value(status).unwrap(),
                serde_json::Value::from(status.name())
            );
        }
    }
}
