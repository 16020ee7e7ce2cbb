//! A leader's own connection to the broker that leads its log partition (`cluster.log-producer
//! = "shard"`): the records of every partition a shard leads go out from the shard's thread,
//! those queued during one turn of its loop in one `Produce` request, and their answers are read
//! on the same thread. Through librdkafka each record woke a broker thread to send it and its
//! delivery report woke the producer's polling thread and then the shard: three threads and
//! about three context switches per record (`docs/perf.md`, "A cluster node's CPU per call").
//!
//! A link takes no retries: an error answers every record it concerns with CLU0001 and the
//! partition's leader steps down (its pipeline refuses to store anything after a record that did
//! not land where it was meant to), as it did when librdkafka gave up on a record. Without
//! retries no record can land twice, so no producer id is needed. A broker answers the requests
//! of one connection in the order they were sent, so a partition's records, all on one link,
//! land in the order they were handed over.
//!
//! Links are per thread (each shard has its own), per broker address.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedReadHalf;
use tokio::sync::{Notify, mpsc, oneshot};

use super::{lock, wire};
use sluice_core::errors::{Code, CodedError};

/// Most bytes of one answer a broker may send on a link (a produce answer names a few
/// partitions; an `ApiVersions` answer lists a hundred APIs).
const MAX_ANSWER: usize = 1 << 20;

/// How long a link may sit with nothing to send before it closes itself (below the brokers'
/// default `connections.max.idle.ms` of 10 minutes).
pub(crate) const IDLE: Duration = Duration::from_secs(240);

/// Where a record landed, or why it did not.
pub(crate) type Landing = Result<i64, CodedError>;

/// A record waiting for its request.
struct Entry {
    partition: i32,
    record: Vec<u8>,
    done: oneshot::Sender<Landing>,
}

/// A request on the wire, waiting for its answer: per partition, its records' answers in order.
struct Sent {
    correlation: i32,
    /// By when its answer must have come (`cluster.write-timeout` after it went out, the time
    /// the broker was given): past it the link ends.
    due: tokio::time::Instant,
    parts: Vec<(i32, Vec<oneshot::Sender<Landing>>)>,
}

#[derive(Default)]
struct State {
    queue: Vec<Entry>,
    /// Requests sent and not answered yet.
    in_flight: usize,
    /// Why the link ended: every record handed to it afterwards gets this answer.
    dead: Option<CodedError>,
}

/// One connection to one broker, from one thread. See the module documentation.
pub(crate) struct Link {
    state: Mutex<State>,
    wake: Notify,
}

/// What a link needs to know of the log.
#[derive(Clone)]
pub(crate) struct Target {
    /// The broker, `host:port`.
    pub addr: String,
    pub topic: String,
    /// How long the broker may take to replicate a request (`cluster.write-timeout`), and how
    /// long connecting may take.
    pub timeout: Duration,
    /// How long the link may sit with nothing to send before it closes itself ([`IDLE`]).
    pub idle: Duration,
}

thread_local! {
    /// This thread's links, by broker address.
    static LINKS: RefCell<HashMap<String, Arc<Link>>> = RefCell::new(HashMap::new());
}

impl Link {
    /// This thread's live link to `target`'s broker, opened now (its task on this thread's
    /// runtime) when there is none.
    pub(crate) fn to(target: &Target) -> Arc<Link> {
        LINKS.with(|links| {
            let mut links = links.borrow_mut();
            if let Some(link) = links.get(&target.addr)
                && !link.is_dead()
            {
                return Arc::clone(link);
            }
            let link = Arc::new(Link {
                state: Mutex::new(State::default()),
                wake: Notify::new(),
            });
            tokio::spawn(run(Arc::clone(&link), target.clone()));
            links.insert(target.addr.clone(), Arc::clone(&link));
            link
        })
    }

    /// Hands `record` for `partition` to the link: it goes out with the next request.
    pub(crate) fn send(&self, partition: i32, record: &[u8]) -> oneshot::Receiver<Landing> {
        let (done, answer) = oneshot::channel();
        let mut state = lock(&self.state);
        if let Some(why) = &state.dead {
            let _ = done.send(Err(why.clone()));
            return answer;
        }
        state.queue.push(Entry {
            partition,
            record: record.to_vec(),
            done,
        });
        drop(state);
        self.wake.notify_one();
        answer
    }

    /// Whether the link ended (the broker closed it, or an error did).
    pub(crate) fn is_dead(&self) -> bool {
        lock(&self.state).dead.is_some()
    }

    /// Ends the link with `why`: every record waiting for a request gets it.
    fn kill(&self, why: &CodedError) {
        let queue = {
            let mut state = lock(&self.state);
            state.dead.get_or_insert_with(|| why.clone());
            std::mem::take(&mut state.queue)
        };
        for entry in queue {
            let _ = entry.done.send(Err(why.clone()));
        }
    }

    /// What waits for a request, counted as one request in flight when there is any.
    fn take_queue(&self) -> Vec<Entry> {
        let mut state = lock(&self.state);
        if !state.queue.is_empty() {
            state.in_flight += 1;
        }
        std::mem::take(&mut state.queue)
    }

    fn answered(&self) {
        let mut state = lock(&self.state);
        state.in_flight = state.in_flight.saturating_sub(1);
    }

    /// Ends the link when nothing waits on it (no record queued, no request in flight): a
    /// broker closes a connection idle for `connections.max.idle.ms` (10 minutes by default),
    /// and one closed under a record on its way would fail that record's partition.
    fn retire_if_idle(&self) -> bool {
        let mut state = lock(&self.state);
        let idle = state.queue.is_empty() && state.in_flight == 0;
        if idle {
            state.dead.get_or_insert_with(|| {
                CodedError::new(
                    Code::CLU0001,
                    "the leader's link to its broker was idle and closed",
                )
            });
        }
        idle
    }
}

/// Connects, then sends and reads until an error ends the link; every record in flight or
/// waiting then gets that error.
async fn run(link: Arc<Link>, target: Target) {
    let (sent_tx, mut sent_rx) = mpsc::unbounded_channel::<Sent>();
    // The requests on the wire, oldest first (`read_loop` keeps it).
    let mut pending = VecDeque::new();
    let Err(why) = serve(&link, &target, sent_tx, &mut sent_rx, &mut pending).await;
    tracing::debug!(broker = %target.addr, error = %why, "a leader's link to a broker ended");
    link.kill(&why);
    sent_rx.close();
    while let Ok(sent) = sent_rx.try_recv() {
        pending.push_back(sent);
    }
    for sent in pending {
        answer_all(sent, &why);
    }
}

async fn serve(
    link: &Link,
    target: &Target,
    sent_tx: mpsc::UnboundedSender<Sent>,
    sent_rx: &mut mpsc::UnboundedReceiver<Sent>,
    pending: &mut VecDeque<Sent>,
) -> Result<Infallible, CodedError> {
    let addr = &target.addr;
    let stream = tokio::time::timeout(target.timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| failed(addr, "connecting took longer than cluster.write-timeout"))?
        .map_err(|e| failed(addr, &format!("cannot connect: {e}")))?;
    let _ = stream.set_nodelay(true);
    let (mut read, mut write) = stream.into_split();
    write
        .write_all(&wire::api_versions(0))
        .await
        .map_err(|e| failed(addr, &format!("cannot write: {e}")))?;
    let frame = tokio::time::timeout(target.timeout, read_frame(&mut read, addr))
        .await
        .map_err(|_| failed(addr, "no ApiVersions answer within cluster.write-timeout"))??;
    let (_, body) = wire::correlation(&frame)?;
    let version = wire::produce_version(body)?;
    let sending = send_loop(link, target, version, sent_tx, &mut write);
    let reading = read_loop(link, &mut read, addr, version, sent_rx, pending);
    tokio::select! {
        why = sending => why,
        why = reading => why,
    }
}

/// Sends what is queued, one request per wake: the records the partitions of this thread
/// handed over since the last request.
async fn send_loop(
    link: &Link,
    target: &Target,
    version: i16,
    sent_tx: mpsc::UnboundedSender<Sent>,
    write: &mut tokio::net::tcp::OwnedWriteHalf,
) -> Result<Infallible, CodedError> {
    let timeout_ms = i32::try_from(target.timeout.as_millis()).unwrap_or(i32::MAX);
    let mut correlation = 0i32;
    loop {
        let entries = link.take_queue();
        if entries.is_empty() {
            if tokio::time::timeout(target.idle, link.wake.notified())
                .await
                .is_err()
                && link.retire_if_idle()
            {
                return Err(failed(&target.addr, "idle"));
            }
            continue;
        }
        correlation = correlation.wrapping_add(1);
        // Per partition, its records in the order handed over.
        let mut parts: Vec<(i32, Vec<Entry>)> = Vec::new();
        for entry in entries {
            match parts.iter_mut().find(|(p, _)| *p == entry.partition) {
                Some((_, list)) => list.push(entry),
                None => parts.push((entry.partition, vec![entry])),
            }
        }
        let frame = {
            let wire_parts: Vec<wire::Part<'_>> = parts
                .iter()
                .map(|(partition, list)| wire::Part {
                    partition: *partition,
                    records: list.iter().map(|e| e.record.as_slice()).collect(),
                })
                .collect();
            wire::produce(
                version,
                correlation,
                &target.topic,
                timeout_ms,
                now_ms(),
                &wire_parts,
            )
        };
        let sent = Sent {
            correlation,
            due: tokio::time::Instant::now() + target.timeout,
            parts: parts
                .into_iter()
                .map(|(p, list)| (p, list.into_iter().map(|e| e.done).collect()))
                .collect(),
        };
        // Before the request goes out, so its answer always finds it.
        if sent_tx.send(sent).is_err() {
            return Err(failed(&target.addr, "the link's reader stopped"));
        }
        write
            .write_all(&frame)
            .await
            .map_err(|e| failed(&target.addr, &format!("cannot write: {e}")))?;
    }
}

/// Reads the answers in the order their requests went out (`pending`) and answers each record.
/// It watches the connection while nothing is in flight too, so a link the broker closed is
/// known as ended before a record is handed to it. What is still pending when it ends, [`run`]
/// answers with why.
async fn read_loop(
    link: &Link,
    read: &mut OwnedReadHalf,
    addr: &str,
    version: i16,
    sent_rx: &mut mpsc::UnboundedReceiver<Sent>,
    pending: &mut VecDeque<Sent>,
) -> Result<Infallible, CodedError> {
    let mut buf = Vec::with_capacity(4096);
    loop {
        // Every request is handed over before it is written, so the request an answer read
        // so far belongs to is in the channel by now.
        while let Ok(sent) = sent_rx.try_recv() {
            pending.push_back(sent);
        }
        while let Some(frame) = take_frame(&mut buf, addr)? {
            let Some(sent) = pending.pop_front() else {
                return Err(failed(addr, "an answer came for no request"));
            };
            link.answered();
            answer(sent, &frame, addr, version)?;
        }
        let due = pending.front().map(|sent| sent.due);
        buf.reserve(4096);
        tokio::select! {
            biased;
            sent = sent_rx.recv() => match sent {
                Some(sent) => pending.push_back(sent),
                None => return Err(failed(addr, "the link's sender stopped")),
            },
            read = read.read_buf(&mut buf) => match read {
                Ok(0) => return Err(failed(addr, "the broker closed the connection")),
                Ok(_) => {}
                Err(e) => return Err(failed(addr, &format!("the broker closed the connection ({e})"))),
            },
            () = sleep_until(due), if due.is_some() => {
                return Err(failed(addr, "no answer within cluster.write-timeout"));
            }
        }
    }
}

async fn sleep_until(due: Option<tokio::time::Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// Answers each record of `sent` from its answer `frame`; an answer that does not belong to it
/// or does not parse ends the link (after answering them with that).
fn answer(sent: Sent, frame: &[u8], addr: &str, version: i16) -> Result<(), CodedError> {
    let parsed = wire::correlation(frame).and_then(|(correlation, body)| {
        if correlation != sent.correlation {
            return Err(failed(
                addr,
                &format!(
                    "an answer for request {correlation} came where {} was due",
                    sent.correlation
                ),
            ));
        }
        wire::produce_answer(version, body)
    });
    let landed = match parsed {
        Ok(landed) => landed,
        Err(why) => {
            answer_all(sent, &why);
            return Err(why);
        }
    };
    for (partition, answers) in sent.parts {
        let result = match landed.iter().find(|l| l.partition == partition) {
            Some(l) if l.error == 0 && l.base_offset >= 0 => Ok(l.base_offset),
            Some(l) => Err(refused(partition, l.error)),
            None => Err(failed(
                addr,
                &format!("the answer left partition {partition} out"),
            )),
        };
        for (i, answer) in answers.into_iter().enumerate() {
            let _ = answer.send(result.clone().map(|base| base.saturating_add(i as i64)));
        }
    }
    Ok(())
}

/// The next whole answer frame in `buf` (taken out of it), if one is there.
fn take_frame(buf: &mut Vec<u8>, addr: &str) -> Result<Option<Vec<u8>>, CodedError> {
    let Some(size) = buf.first_chunk::<4>().map(|b| i32::from_be_bytes(*b)) else {
        return Ok(None);
    };
    let size = frame_size(size, addr)?;
    if buf.len() < 4 + size {
        return Ok(None);
    }
    let frame = buf[4..4 + size].to_vec();
    buf.drain(..4 + size);
    Ok(Some(frame))
}

fn frame_size(size: i32, addr: &str) -> Result<usize, CodedError> {
    usize::try_from(size)
        .ok()
        .filter(|size| *size >= 4 && *size <= MAX_ANSWER)
        .ok_or_else(|| failed(addr, &format!("an answer of {size} bytes")))
}

fn answer_all(sent: Sent, why: &CodedError) {
    for (_, answers) in sent.parts {
        for answer in answers {
            let _ = answer.send(Err(why.clone()));
        }
    }
}

/// One answer frame (its length first), at most [`MAX_ANSWER`] bytes.
async fn read_frame(read: &mut OwnedReadHalf, addr: &str) -> Result<Vec<u8>, CodedError> {
    let size = read
        .read_i32()
        .await
        .map_err(|e| failed(addr, &format!("the broker closed the connection ({e})")))?;
    let size = frame_size(size, addr)?;
    let mut frame = vec![0; size];
    read.read_exact(&mut frame)
        .await
        .map_err(|e| failed(addr, &format!("the broker closed the connection ({e})")))?;
    Ok(frame)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn failed(addr: &str, why: &str) -> CodedError {
    CodedError::new(
        Code::CLU0001,
        format!("the leader's link to broker {addr}: {why}"),
    )
}

/// A record the broker refused, by Kafka's error code.
fn refused(partition: i32, code: i16) -> CodedError {
    let name = match code {
        3 => "UNKNOWN_TOPIC_OR_PARTITION",
        6 => "NOT_LEADER_OR_FOLLOWER",
        7 => "REQUEST_TIMED_OUT",
        10 => "MESSAGE_TOO_LARGE",
        19 => "NOT_ENOUGH_REPLICAS",
        20 => "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        29 => "TOPIC_AUTHORIZATION_FAILED",
        87 => "INVALID_RECORD",
        _ => "",
    };
    CodedError::new(
        Code::CLU0001,
        format!(
            "partition {partition}: the broker did not take the record (Kafka error {code} {name})"
        ),
    )
}

#[cfg(test)]
mod tests {
    use rdkafka::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use rdkafka::mocking::MockCluster;

    use super::*;

    fn target(addr: String) -> Target {
        Target {
            addr,
            topic: "log".into(),
            timeout: Duration::from_secs(5),
            idle: IDLE,
        }
    }

    /// A broker on loopback that answers `ApiVersions` (Produce v3-v7) and then does what
    /// `then` does with the connection.
    async fn fake_broker<F, Fut>(then: F) -> (String, tokio::task::JoinHandle<()>)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let broker = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let size = socket.read_i32().await.unwrap();
            let mut request = vec![0; size as usize];
            socket.read_exact(&mut request).await.unwrap();
            let mut answer = Vec::new();
            answer.extend_from_slice(&request[4..8]); // its correlation id
            answer.extend_from_slice(&0i16.to_be_bytes());
            answer.extend_from_slice(&1i32.to_be_bytes());
            for v in [0i16, 3, 7] {
                answer.extend_from_slice(&v.to_be_bytes());
            }
            socket
                .write_all(&(answer.len() as i32).to_be_bytes())
                .await
                .unwrap();
            socket.write_all(&answer).await.unwrap();
            then(socket).await;
        });
        (addr, broker)
    }

    /// Waits, a bounded while, until `link` ended.
    async fn ended(link: &Link) {
        let started = std::time::Instant::now();
        while !link.is_dead() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the link did not end"
            );
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The values of `partition` of `topic` from its start, as librdkafka reads them.
    fn read_back(bootstrap: &str, partition: i32, count: usize) -> Vec<(i64, Vec<u8>)> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "check")
            .create()
            .unwrap();
        let mut list = rdkafka::TopicPartitionList::new();
        list.add_partition_offset("log", partition, rdkafka::Offset::Beginning)
            .unwrap();
        consumer.assign(&list).unwrap();
        let mut read = Vec::new();
        let started = std::time::Instant::now();
        while read.len() < count && started.elapsed() < Duration::from_secs(30) {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                read.push((m.offset(), m.payload().unwrap_or_default().to_vec()));
            }
        }
        read
    }

    #[tokio::test]
    async fn records_of_several_partitions_land_in_order_and_read_back_through_librdkafka() {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic("log", 2, 1).unwrap();
        let bootstrap = cluster.bootstrap_servers();
        let link = Link::to(&target(bootstrap.clone()));
        // Handed over in one turn: they go out in one request.
        let answers: Vec<_> = [(0, "a0"), (1, "b0"), (0, "a1"), (0, "a2"), (1, "b1")]
            .iter()
            .map(|(p, v)| link.send(*p, v.as_bytes()))
            .collect();
        let mut landed = Vec::new();
        for answer in answers {
            landed.push(answer.await.unwrap().unwrap());
        }
        assert_eq!(landed, [0, 0, 1, 2, 1]);
        // The next turn's records land behind them.
        assert_eq!(link.send(1, b"b2").await.unwrap(), Ok(2));
        assert_eq!(link.send(0, b"a3").await.unwrap(), Ok(3));
        assert!(Arc::ptr_eq(&link, &Link::to(&target(bootstrap.clone()))));
        let (b, a) = tokio::task::spawn_blocking(move || {
            (read_back(&bootstrap, 1, 3), read_back(&bootstrap, 0, 4))
        })
        .await
        .unwrap();
        let values = |read: Vec<(i64, Vec<u8>)>| {
            read.into_iter()
                .map(|(at, v)| (at, String::from_utf8(v).unwrap()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            values(a),
            [(0, "a0"), (1, "a1"), (2, "a2"), (3, "a3")].map(|(o, v)| (o, v.to_string()))
        );
        assert_eq!(
            values(b),
            [(0, "b0"), (1, "b1"), (2, "b2")].map(|(o, v)| (o, v.to_string()))
        );
    }

    #[tokio::test]
    async fn many_requests_in_flight_at_once_are_each_answered_in_order() {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic("log", 3, 1).unwrap();
        let link = Link::to(&target(cluster.bootstrap_servers()));
        // Each turn's records go out as a request of their own, without waiting for the
        // answers of the turns before.
        let mut answers = Vec::new();
        for turn in 0..300i64 {
            answers.push((turn, link.send((turn % 3) as i32, b"r")));
            if turn % 2 == 0 {
                tokio::task::yield_now().await;
            }
        }
        let mut next = [0i64; 3];
        for (turn, answer) in answers {
            let p = (turn % 3) as usize;
            assert_eq!(answer.await.unwrap(), Ok(next[p]), "turn {turn}");
            next[p] += 1;
        }
        assert!(!link.is_dead());
    }

    #[tokio::test]
    async fn a_partition_the_broker_does_not_have_is_refused_with_its_kafka_error() {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic("log", 1, 1).unwrap();
        let link = Link::to(&target(cluster.bootstrap_servers()));
        let (good, bad) = (link.send(0, b"x"), link.send(7, b"y"));
        assert_eq!(good.await.unwrap(), Ok(0));
        let refused = bad.await.unwrap().unwrap_err();
        assert_eq!(refused.code, Some(Code::CLU0001));
        assert!(
            refused
                .message
                .contains("Kafka error 3 UNKNOWN_TOPIC_OR_PARTITION"),
            "{refused}"
        );
        // A refused record leaves the link up for the others.
        assert_eq!(link.send(0, b"z").await.unwrap(), Ok(1));
    }

    #[tokio::test]
    async fn a_broker_that_is_not_there_answers_every_record_with_clu0001() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let link = Link::to(&target(addr.clone()));
        let refused = link.send(0, b"x").await.unwrap().unwrap_err();
        assert_eq!(refused.code, Some(Code::CLU0001));
        assert!(refused.message.contains("cannot connect"), "{refused}");
        assert!(link.is_dead());
        // A record handed to the ended link is answered at once, and the thread's next link
        // to that broker is a new one.
        assert!(link.send(0, b"y").await.unwrap().is_err());
        assert!(!Arc::ptr_eq(&link, &Link::to(&target(addr))));
    }

    #[tokio::test]
    async fn a_request_the_broker_never_answers_fails_its_records_by_the_write_timeout() {
        let (addr, broker) = fake_broker(|mut socket| async move {
            let mut sink = [0u8; 1024];
            while socket.read(&mut sink).await.is_ok_and(|n| n > 0) {}
        })
        .await;
        let link = Link::to(&Target {
            timeout: Duration::from_millis(300),
            ..target(addr)
        });
        let refused = link.send(0, b"x").await.unwrap().unwrap_err();
        assert_eq!(refused.code, Some(Code::CLU0001));
        assert!(
            refused
                .message
                .contains("no answer within cluster.write-timeout"),
            "{refused}"
        );
        assert!(link.is_dead());
        broker.abort();
    }

    #[tokio::test]
    async fn an_idle_link_closes_itself_and_one_the_broker_closed_is_known_as_ended() {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic("log", 1, 1).unwrap();
        let idle = Target {
            idle: Duration::from_millis(100),
            ..target(cluster.bootstrap_servers())
        };
        let link = Link::to(&idle);
        assert_eq!(link.send(0, b"x").await.unwrap(), Ok(0));
        ended(&link).await;
        let next = Link::to(&idle);
        assert!(!Arc::ptr_eq(&link, &next));
        assert_eq!(next.send(0, b"y").await.unwrap(), Ok(1));

        let (addr, broker) = fake_broker(|socket| async move { drop(socket) }).await;
        let closed = Link::to(&target(addr));
        ended(&closed).await;
        assert!(closed.send(0, b"z").await.unwrap().is_err());
        broker.await.unwrap();
    }

    #[tokio::test]
    async fn a_broker_answer_past_the_bound_ends_the_link() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let broker = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 64];
            let _ = socket.read(&mut request).await;
            socket.write_all(&i32::MAX.to_be_bytes()).await.unwrap();
            socket
        });
        let link = Link::to(&target(addr));
        let refused = link.send(0, b"x").await.unwrap().unwrap_err();
        assert!(
            refused.message.contains("an answer of 2147483647 bytes"),
            "{refused}"
        );
        drop(broker.await.unwrap());
    }
}
