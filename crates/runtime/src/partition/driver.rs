//! What a partition asks of the world outside it: the time, attempts on deployments, and the
//! other partitions. The partition decides what happens; its driver only carries it out. The
//! server's driver is tokio, the wall clock and HTTP ([`TokioDriver`]); the simulator's is a
//! script with a clock of its own, so a seed replays a run exactly.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use tokio::sync::mpsc;

use super::model::events::Event;
use crate::invoker::{AttemptClient, AttemptError, AttemptRequest, MessageSink};
use sluice_core::clock;
use sluice_core::errors::CodedError;
use sluice_core::ids::InvocationId;
use sluice_protocol::Message;

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
/// and its end come back as events, later.
pub trait Driver: Send + Sync + 'static {
    /// Milliseconds since the epoch: the one clock the partition reads.
    fn now_ms(&self) -> u64;
    /// Runs `attempt`; reports its messages and its end as [`Event::AttemptMessage`] and
    /// [`Event::AttemptDone`] to the partition, through [`Driver::poll_attempts`] or its
    /// channel.
    fn start(&self, attempt: Started);
    /// Moves the attempts started here along and adds what they reported to `events`; `cx`
    /// is woken when there is more. It polls no further attempt once `events` holds `most`
    /// (one attempt polled adds all it read, which may pass it). A driver whose attempts
    /// report through the partition's channel adds nothing.
    fn poll_attempts(&self, cx: &mut Context<'_>, events: &mut Vec<Event>, most: usize) {
        let _ = (cx, events, most);
    }
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

/// The server's driver: the wall clock, attempts over HTTP polled by the partition's own loop
/// ([`Driver::poll_attempts`]), other partitions through the runtime's channels.
///
/// An attempt is no task of its own and reports through no channel: the partition's loop polls
/// it, so the deployment's bytes arriving wake the partition itself, and what the attempt read
/// joins the partition's next batch in the same turn. That is one task wake and no channel
/// send per message instead of a wake of the attempt's task and then one of the partition's.
pub struct TokioDriver<M> {
    runtime: M,
    client: AttemptClient,
    /// Its attempts still running. Dropping the driver (the partition stepped down from a
    /// cluster partition, or stopped) drops them, so the next leader's attempts never overlap
    /// them.
    attempts: Mutex<FuturesUnordered<Running>>,
    /// What the attempts reported and the loop has not taken yet, in the order they reported
    /// it: each attempt's messages, then its end.
    reported: Arc<Mutex<Vec<Event>>>,
}

/// One attempt being run: it ends once its end is reported.
type Running = Pin<Box<dyn Future<Output = ()> + Send>>;

impl<M: Mailboxes> TokioDriver<M> {
    /// A driver running its attempts on `client`, reaching other partitions through
    /// `runtime`.
    pub fn new(runtime: M, client: AttemptClient) -> Self {
        Self {
            runtime,
            client,
            attempts: Mutex::default(),
            reported: Arc::default(),
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
        let mut sink = Reporter {
            reported: Arc::clone(&self.reported),
            id,
            attempt,
        };
        let client = self.client.clone();
        let running: Running = Box::pin(async move {
            let result = match request {
                Ok(request) => client
                    .stream(&request, inbound, &mut sink)
                    .await
                    .map(|(ending, _)| ending),
                Err(e) => Err(AttemptError::from(e)),
            };
            sink.report(Event::AttemptDone {
                id,
                attempt,
                result,
            });
        });
        lock(&self.attempts).push(running);
    }

    fn poll_attempts(&self, cx: &mut Context<'_>, events: &mut Vec<Event>, most: usize) {
        let mut attempts = lock(&self.attempts);
        // Each turn polls only the attempts woken since the last (`FuturesUnordered` keeps
        // them apart); those woken but not polled because the batch filled stay ready for
        // the next call, which the loop makes once this batch is applied.
        while events.len() + lock(&self.reported).len() < most {
            match attempts.poll_next_unpin(cx) {
                Poll::Ready(Some(())) => {}
                Poll::Ready(None) | Poll::Pending => break,
            }
        }
        events.append(&mut lock(&self.reported));
    }

    fn post(&self, id: InvocationId, event: Event) {
        self.runtime.post(id, event);
    }

    fn nudge(&self, waiting: u64, from: u32) {
        self.runtime.nudge(waiting, from);
    }
}

/// A lock nobody holds across an await: a panic while holding it left nothing half-done that
/// matters more than going on.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Hands an attempt's messages to its partition's next batch.
struct Reporter {
    reported: Arc<Mutex<Vec<Event>>>,
    id: InvocationId,
    attempt: u32,
}

impl Reporter {
    fn report(&self, event: Event) {
        lock(&self.reported).push(event);
    }
}

impl MessageSink for Reporter {
    async fn answered(&mut self) {
        self.report(Event::AttemptAnswered {
            id: self.id,
            attempt: self.attempt,
        });
    }

    async fn deliver(&mut self, message: Message, ack: bool) {
        self.report(Event::AttemptMessage {
            id: self.id,
            attempt: self.attempt,
            message,
            ack,
        });
    }
}
