//! One consumer per subscription: each record becomes an invocation of the sink, stored
//! durably before its offset is committed (at least once). The invocation id derives from
//! (subscription, topic, partition, offset), so a record delivered again finds its invocation
//! and is not invoked twice.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::Message as _;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::{Offset, TopicPartitionList};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use super::{Subscription, lock};
use sluice_core::clock::now_ms;
use sluice_core::errors::{Code, CodedError};
use sluice_flow::Scope;
use sluice_protocol::{Frame, Message, proto};
use sluice_runtime::partition::Runtime;
use sluice_store::invocation::new::{Identity, NewInvocation};
use sluice_store::invocation::{InvocationRecord, Target};

/// Why a record cannot become an invocation (it is skipped, and said so in the log): ING0009,
/// with the rule it broke.
type Skip = CodedError;

fn skip(why: impl std::fmt::Display) -> Skip {
    CodedError::new(Code::ING0009, format!("the record is skipped: {why}"))
}

/// The invocation a record becomes.
fn invocation_of(
    sub: &Subscription,
    message: &BorrowedMessage<'_>,
) -> Result<(InvocationRecord, Frame), Skip> {
    let mut headers: Vec<(String, String)> = Vec::new();
    if let Some(kafka_headers) = message.headers() {
        for header in kafka_headers.iter() {
            if let Some(value) = header.value.and_then(|v| std::str::from_utf8(v).ok()) {
                headers.push((header.key.to_owned(), value.to_owned()));
            }
        }
    }
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let scope = header(sluice_flow::SCOPE_HEADER).or_else(|| sub.options.get("scope").cloned());
    let limit_key =
        header(sluice_flow::LIMIT_KEY_HEADER).or_else(|| sub.options.get("limit-key").cloned());
    let (scope, limit_key) =
        sluice_flow::scope::parse_request(scope.as_deref(), limit_key.as_deref())
            .map_err(|e| skip(format_args!("[RT0024] {}", e.message)))?;
    let priority = header(sluice_flow::PRIORITY_HEADER)
        .or_else(|| sub.options.get("priority").cloned())
        .map(|p| p.parse::<sluice_flow::Priority>())
        .transpose()
        .map_err(|e| skip(format_args!("[RT0024] {e}")))?;
    let key = match (sub.keyed, message.key()) {
        (false, _) => None,
        (true, Some(key)) => Some(
            std::str::from_utf8(key)
                .map_err(|_| skip("the record key is not UTF-8"))?
                .to_owned(),
        ),
        (true, None) => {
            return Err(skip(format_args!(
                "'{}' is a virtual object: its records need keys (the key is the object key)",
                sub.service
            )));
        }
    };
    let digest = Sha256::new()
        .chain_update(sub.id.to_string())
        .chain_update([0])
        .chain_update(message.topic())
        .chain_update(message.partition().to_be_bytes())
        .chain_update(message.offset().to_be_bytes())
        .finalize();
    let uuid = u128::from_be_bytes(digest[..16].try_into().expect("16 bytes"));
    // An object's records go to its partition; others spread by their coordinates.
    let partition = key
        .is_none()
        .then(|| u64::from_be_bytes(digest[16..24].try_into().expect("8 bytes")));
    let target = Target {
        service: sub.service.clone(),
        handler: sub.handler.clone(),
        key,
    };
    let record = NewInvocation::new(target, Identity::Derived { uuid, partition })
        .in_scope(scope, limit_key)
        .with_priority(priority)
        .into_record(now_ms());
    let frame = Message::Input(proto::InputCommandMessage {
        headers: headers
            .into_iter()
            .map(|(key, value)| proto::Header { key, value })
            .collect(),
        value: Some(proto::Value {
            content: bytes::Bytes::copy_from_slice(message.payload().unwrap_or_default()),
        }),
        name: String::new(),
    })
    .to_frame(false);
    Ok((record, frame))
}

/// Records handed to the partitions whose storage is not yet confirmed, at most.
const WINDOW: usize = 256;

/// A record on its way into the store.
enum InFlight {
    /// Handed over; the answer says when it is durable.
    Stored(
        tokio::sync::oneshot::Receiver<Result<bool, sluice_core::errors::CodedError>>,
        InvocationRecord,
        Frame,
    ),
    /// The hand-over failed, or its partition answered an error or stopped without an answer;
    /// it is tried again when its turn comes.
    Failed(String, InvocationRecord, Frame),
    /// Durable; its offset may move on.
    Durable,
    /// Not an invocation (logged); its offset may move on.
    Skipped,
}

impl InFlight {
    /// Whether its turn to settle came: it is durable, has nothing to wait for, or its answer
    /// can no longer come. A partition that steps down drops the answers it owes: such a
    /// record is tried again at once, not left waiting behind a full window.
    fn ready(&mut self) -> bool {
        use tokio::sync::oneshot::error::TryRecvError;
        let InFlight::Stored(answer, ..) = self else {
            return true;
        };
        let why = match answer.try_recv() {
            Err(TryRecvError::Empty) => return false,
            Ok(Ok(_)) => {
                *self = InFlight::Durable;
                return true;
            }
            Ok(Err(e)) => e.to_string(),
            Err(TryRecvError::Closed) => "the partition stopped before it stored it".to_owned(),
        };
        if let InFlight::Stored(_, record, frame) = std::mem::replace(self, InFlight::Skipped) {
            *self = InFlight::Failed(why, record, frame);
        }
        true
    }
}

/// Waits until `stored` is durable, retrying it as long as it fails; false when stopped.
async fn settle(
    stored: InFlight,
    runtime: &Runtime,
    sub: &Subscription,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let (mut error, record, frame) = match stored {
        InFlight::Skipped | InFlight::Durable => return true,
        InFlight::Stored(answer, record, frame) => match answer.await {
            Ok(Ok(_)) => return true,
            Ok(Err(e)) => (e.to_string(), record, frame),
            Err(_) => ("the partition stopped".to_owned(), record, frame),
        },
        InFlight::Failed(error, record, frame) => (error, record, frame),
    };
    loop {
        tracing::warn!(subscription = %sub.id, error = %error, "cannot store the record's invocation; retrying");
        tokio::select! {
            _ = stop.changed() => return false,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        match runtime.submit(record.clone(), frame.clone()).await {
            Ok(_) => return true,
            Err(e) => error = e.to_string(),
        }
    }
}

/// Queued invocations of the sink's queue above which consumption pauses (option `max-queued`).
const DEFAULT_MAX_QUEUED: usize = 10_000;

/// Kafka partitions of a subscription that backpressure paused, shared with the admin API.
pub type PausedPartitions = Arc<Mutex<BTreeSet<i32>>>;

/// Records behind the end of the consumer's partitions, from librdkafka's statistics (-1 until
/// the first report).
pub type Lag = Arc<std::sync::atomic::AtomicI64>;

/// How often librdkafka reports its statistics (the lag gauge's freshness).
const STATISTICS_INTERVAL_MS: &str = "5000";

/// Reads the consumer lag out of librdkafka's statistics.
struct LagContext(Lag);

impl rdkafka::client::ClientContext for LagContext {
    fn stats(&self, statistics: rdkafka::statistics::Statistics) {
        // Partition -1 is librdkafka's internal one; a lag of -1 is not known yet.
        let lag: i64 = statistics
            .topics
            .values()
            .flat_map(|t| t.partitions.values())
            .filter(|p| p.partition >= 0 && p.consumer_lag >= 0)
            .map(|p| p.consumer_lag)
            .fold(0i64, i64::saturating_add);
        self.0.store(lag, std::sync::atomic::Ordering::Relaxed);
    }
}

impl rdkafka::consumer::ConsumerContext for LagContext {}

/// Backpressure per Kafka partition: a partition pauses while the sink's queue in the scope
/// its latest record went to holds more than `bound` waiting invocations, and resumes once that
/// queue is down to half. Records of one partition may name different scopes (the
/// `x-service-scope` header), so a full scope holds back only the partitions feeding it.
struct Backpressure {
    bound: usize,
    /// Records handed over since the queues were last measured; measured every `every`.
    since_check: usize,
    every: usize,
    /// The scope each partition's latest record went to.
    feeds: HashMap<i32, Option<Scope>>,
    paused: PausedPartitions,
}

impl Backpressure {
    fn new(sub: &Subscription, paused: PausedPartitions) -> Self {
        let bound = sub
            .options
            .get("max-queued")
            .and_then(|b| b.parse().ok())
            .unwrap_or(DEFAULT_MAX_QUEUED);
        Self {
            bound,
            since_check: 0,
            every: bound.clamp(1, 64),
            feeds: HashMap::new(),
            paused,
        }
    }

    /// A record of `partition` went to `scope`.
    fn fed(&mut self, partition: i32, scope: Option<&Scope>) {
        self.since_check += 1;
        if self.feeds.get(&partition).map(Option::as_ref) != Some(scope) {
            self.feeds.insert(partition, scope.cloned());
        }
    }

    fn any_paused(&self) -> bool {
        !lock(&self.paused).is_empty()
    }

    /// Invocations of `sub`'s sink waiting in queues, per scope.
    async fn queued(sub: &Subscription, runtime: &Runtime) -> HashMap<Option<Scope>, usize> {
        runtime
            .waiting_by_scope(&sub.service)
            .await
            .unwrap_or_default()
    }

    /// Measures when due (or `force`), and pauses or resumes each of `consumer`'s partitions.
    async fn check(
        &mut self,
        sub: &Subscription,
        runtime: &Runtime,
        consumer: &StreamConsumer<LagContext>,
        window: &VecDeque<((i32, i64), InFlight)>,
        force: bool,
    ) {
        let any_paused = self.any_paused();
        if !force && !any_paused && self.since_check < self.every {
            return;
        }
        self.since_check = 0;
        let mut queued = Self::queued(sub, runtime).await;
        // A queue counts an invocation once its commit is done; the ones handed over and not
        // yet committed will join it, so they count too (else a fast topic overshoots the bound
        // by a whole group commit).
        for (_, stored) in window {
            if let InFlight::Stored(answer, record, _) = stored
                && answer.is_empty()
            {
                *queued.entry(record.scope.clone()).or_insert(0) += 1;
            }
        }
        let Ok(assigned) = consumer.assignment() else {
            return;
        };
        for element in assigned.elements() {
            let partition = element.partition();
            let Some(scope) = self.feeds.get(&partition) else {
                continue;
            };
            let waiting = queued.get(scope).copied().unwrap_or(0);
            let was_paused = lock(&self.paused).contains(&partition);
            let mut one = TopicPartitionList::new();
            one.add_partition(element.topic(), partition);
            if !was_paused && waiting > self.bound {
                if consumer.pause(&one).is_ok() {
                    lock(&self.paused).insert(partition);
                    tracing::info!(subscription = %sub.id, partition, scope = ?scope, waiting, bound = self.bound, "sink queue full: partition paused");
                }
            } else if was_paused && waiting <= self.bound / 2 && consumer.resume(&one).is_ok() {
                lock(&self.paused).remove(&partition);
                tracing::info!(subscription = %sub.id, partition, scope = ?scope, waiting, "sink queue drained: partition resumed");
            }
        }
    }
}

/// A consumer for `sub` on the cluster's `properties`: its own group unless it names one,
/// offsets committed by hand, its lag kept in `lag`.
fn consumer_of(
    sub: &Subscription,
    properties: &BTreeMap<String, String>,
    lag: Lag,
) -> rdkafka::error::KafkaResult<StreamConsumer<LagContext>> {
    let mut config = ClientConfig::new();
    // A consumer killed with its process keeps its partitions until its session times out
    // (45 s by default): a shorter session lets a restarted Sluice resume sooner. The
    // cluster's properties may say otherwise.
    config
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "2000");
    for (key, value) in properties {
        config.set(key, value);
    }
    let reset = sub
        .options
        .get("auto.offset.reset")
        .map_or("earliest", String::as_str);
    // Its own consumer group unless it names one (or its cluster does).
    match sub.options.get("group.id") {
        Some(group) => config.set("group.id", group),
        None if properties.contains_key("group.id") => &mut config,
        None => config.set("group.id", sub.id.to_string()),
    };
    config
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", reset);
    config.set("statistics.interval.ms", STATISTICS_INTERVAL_MS);
    lag.store(-1, std::sync::atomic::Ordering::Relaxed);
    config.create_with_context(LagContext(lag))
}

/// Consumes `sub` until `stop` changes.
pub async fn run(
    sub: Subscription,
    properties: BTreeMap<String, String>,
    runtime: Runtime,
    paused: PausedPartitions,
    lag: Lag,
    mut stop: watch::Receiver<bool>,
) {
    let mut backpressure = Backpressure::new(&sub, paused);
    let consumer = match consumer_of(&sub, &properties, lag) {
        Ok(consumer) => consumer,
        Err(e) => {
            tracing::error!(subscription = %sub.id, error = %e, "cannot create the Kafka consumer");
            return;
        }
    };
    if let Err(e) = consumer.subscribe(&[&sub.topic]) {
        tracing::error!(subscription = %sub.id, error = %e, "cannot subscribe to the topic");
        return;
    }
    tracing::info!(subscription = %sub.id, topic = %sub.topic, "consuming");
    let mut window: VecDeque<((i32, i64), InFlight)> = VecDeque::new();
    let records = metrics::counter!(
        sluice_core::metrics::KAFKA_RECORDS,
        "subscription" => sub.id.to_string()
    );
    loop {
        let idle = !window.is_empty() || backpressure.any_paused();
        let received = tokio::select! {
            _ = stop.changed() => break,
            received = consumer.recv() => Some(received),
            // While the topic is quiet (or paused), offsets of stored records still move on
            // and the sink's queue is measured again.
            () = tokio::time::sleep(Duration::from_millis(100)), if idle => None,
        };
        backpressure
            .check(&sub, &runtime, &consumer, &window, received.is_none())
            .await;
        match received {
            Some(Ok(message)) => {
                let position = (message.partition(), message.offset());
                let stored = match invocation_of(&sub, &message) {
                    Ok((record, frame)) => {
                        records.increment(1);
                        tracing::debug!(subscription = %sub.id, partition = position.0, offset = position.1, invocation = %record.id, "handing a record's invocation over");
                        backpressure.fed(position.0, record.scope.as_ref());
                        match runtime.hand_over(record.clone(), frame.clone()).await {
                            Ok(answer) => InFlight::Stored(answer, record, frame),
                            Err(e) => InFlight::Failed(e.to_string(), record, frame),
                        }
                    }
                    Err(why) => {
                        tracing::warn!(subscription = %sub.id, partition = position.0, offset = position.1, error.code = ?why.code, "{why}");
                        InFlight::Skipped
                    }
                };
                window.push_back((position, stored));
            }
            Some(Err(e)) => {
                tracing::warn!(subscription = %sub.id, error = %e, "Kafka receive failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            None => {}
        }
        // Offsets move only past records whose invocations are durable, in order.
        while window.len() > WINDOW || window.front_mut().is_some_and(|(_, s)| s.ready()) {
            let Some((position, stored)) = window.pop_front() else {
                break;
            };
            if !settle(stored, &runtime, &sub, &mut stop).await {
                return;
            }
            let mut offsets = TopicPartitionList::new();
            let next = Offset::Offset(position.1 + 1);
            if offsets
                .add_partition_offset(&sub.topic, position.0, next)
                .is_ok()
                && let Err(e) = consumer.commit(&offsets, CommitMode::Async)
            {
                tracing::warn!(subscription = %sub.id, error = %e, "offset commit failed; the record may be delivered again (it is not invoked twice)");
            }
        }
    }
    tracing::info!(subscription = %sub.id, "stopped consuming");
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    fn handed_over() -> (oneshot::Sender<Result<bool, CodedError>>, InFlight) {
        let target = Target {
            service: "Greeter".into(),
            handler: "greet".into(),
            key: None,
        };
        let record = NewInvocation::new(
            target,
            Identity::Derived {
                uuid: 7,
                partition: Some(1),
            },
        )
        .into_record(0);
        let frame = Message::Input(proto::InputCommandMessage::default()).to_frame(false);
        let (reply, answer) = oneshot::channel();
        (reply, InFlight::Stored(answer, record, frame))
    }

    #[test]
    fn a_record_whose_partition_dropped_its_answer_is_tried_again_at_once() {
        // Before, such a record waited until the window overflowed: with fewer records than
        // the window behind it, never, and its invocation was lost.
        let (reply, mut stored) = handed_over();
        assert!(!stored.ready(), "no answer yet");
        drop(reply);
        assert!(stored.ready());
        assert!(matches!(stored, InFlight::Failed(..)));
    }

    #[test]
    fn a_stored_record_settles_and_a_refused_one_is_tried_again() {
        let (reply, mut stored) = handed_over();
        reply.send(Ok(true)).unwrap();
        assert!(stored.ready());
        assert!(matches!(stored, InFlight::Durable));
        let (reply, mut refused) = handed_over();
        reply
            .send(Err(CodedError::new(Code::CLU0001, "stepped down")))
            .unwrap();
        assert!(refused.ready());
        assert!(matches!(refused, InFlight::Failed(why, ..) if why.contains("stepped down")));
        assert!(InFlight::Skipped.ready());
    }
}
