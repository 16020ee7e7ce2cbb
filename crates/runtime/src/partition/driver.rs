//! What a partition asks of the world outside it: the time, attempts on deployments, and the
//! other partitions. The partition decides what happens; its driver only carries it out. The
//! server's driver is tokio, the wall clock and HTTP ([`TokioDriver`]); the simulator's is a
//! script with a clock of its own, so a seed replays a run exactly.

use bytes::Bytes;
use tokio::sync::mpsc;

use super::model::events::Event;
use crate::clock;
use crate::errors::CodedError;
use crate::ids::InvocationId;
use crate::invoker::{AttemptClient, AttemptError, AttemptRequest, MessageSink};
use crate::protocol::Message;

/// An attempt the partition wants run.
#[derive(Debug)]
pub struct Started {
    /// The invocation.
    pub id: InvocationId,
    /// Its number in this process; messages and the end report it.
    pub attempt: u32,
    /// What to send; an error when no deployment can take it (the attempt fails with it).
    pub request: Result<AttemptRequest, CodedError>,
    /// The open request body of a bidi attempt: notifications and acks go down it.
    pub inbound: Option<mpsc::UnboundedReceiver<Bytes>>,
}

/// Carries out what a partition decided. Every method returns at once: messages of an attempt
/// and its end come back as events on the partition's channel, later.
pub trait Driver: Send + Sync + 'static {
    /// Milliseconds since the epoch: the one clock the partition reads.
    fn now_ms(&self) -> u64;
    /// Runs `attempt`; reports its messages and its end as [`Event::AttemptMessage`] and
    /// [`Event::AttemptDone`] to the partition.
    fn start(&self, attempt: Started);
    /// Hands `event` to the partition of `id` (this one or another) without waiting.
    fn post(&self, id: InvocationId, event: Event);
    /// Tells the partitions `waiting` names, except `from`, that invoker slots are free.
    fn nudge(&self, waiting: u64, from: u32);
}

/// Where a partition's events for others go: the runtime's channels in the server
/// (`Runtime`, which implements it). A trait of its own so that the driver needs only this of
/// the runtime, not the runtime itself.
pub trait Mailboxes: Send + Sync + 'static {
    /// Hands `event` to the partition of `id` without waiting.
    fn post(&self, id: InvocationId, event: Event);
    /// Tells the partitions `waiting` names, except `from`, that invoker slots are free.
    fn nudge(&self, waiting: u64, from: u32);
}

/// The server's driver: the wall clock, attempts as tokio tasks over HTTP, other partitions
/// through the runtime's channels.
pub struct TokioDriver<M> {
    runtime: M,
    client: AttemptClient,
    /// The partition's own channel, where its attempts report.
    tx: mpsc::Sender<Event>,
    /// Its attempts still running: dropping the driver (the partition stepped down from a
    /// cluster partition) ends them, so the next leader's attempts never overlap them.
    attempts: std::sync::Mutex<Vec<tokio::task::AbortHandle>>,
}

impl<M> Drop for TokioDriver<M> {
    fn drop(&mut self) {
        for attempt in self
            .attempts
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            attempt.abort();
        }
    }
}

impl<M: Mailboxes> TokioDriver<M> {
    /// A driver for the partition whose channel `tx` is.
    pub fn new(runtime: M, client: AttemptClient, tx: mpsc::Sender<Event>) -> Self {
        Self {
            runtime,
            client,
            tx,
            attempts: std::sync::Mutex::default(),
        }
    }
}

impl<M: Mailboxes> Driver for TokioDriver<M> {
    fn now_ms(&self) -> u64 {
        clock::now_ms()
    }

    fn start(&self, started: Started) {
        let Started {
            id,
            attempt,
            request,
            inbound,
        } = started;
        let mut sink = PartitionSink {
            tx: self.tx.clone(),
            id,
            attempt,
        };
        let client = self.client.clone();
        let running = tokio::spawn(async move {
            let result = match request {
                Ok(request) => client
                    .stream(&request, inbound, &mut sink)
                    .await
                    .map(|(ending, _)| ending),
                Err(e) => Err(AttemptError::from(e)),
            };
            let done = Event::AttemptDone {
                id,
                attempt,
                result,
            };
            let _ = sink.tx.send(done).await;
        });
        let mut attempts = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
        attempts.retain(|attempt| !attempt.is_finished());
        attempts.push(running.abort_handle());
    }

    fn post(&self, id: InvocationId, event: Event) {
        self.runtime.post(id, event);
    }

    fn nudge(&self, waiting: u64, from: u32) {
        self.runtime.nudge(waiting, from);
    }
}

/// Hands an attempt's messages to its partition.
struct PartitionSink {
    tx: mpsc::Sender<Event>,
    id: InvocationId,
    attempt: u32,
}

impl MessageSink for PartitionSink {
    async fn answered(&mut self) {
        let _ = self
            .tx
            .send(Event::AttemptAnswered {
                id: self.id,
                attempt: self.attempt,
            })
            .await;
    }

    async fn deliver(&mut self, message: Message, ack: bool) {
        let _ = self
            .tx
            .send(Event::AttemptMessage {
                id: self.id,
                attempt: self.attempt,
                message,
                ack,
            })
            .await;
    }
}
