//! How long a client may take to read its answers. A client that stops reading (a socket left
//! unread, an HTTP/2 window held at zero) would otherwise hold its connection, its place under
//! the connection cap and the answer's bytes for as long as it likes. Each connection keeps a
//! [`Writes`]: when its answers' bytes last moved and how many it is writing. An answer's
//! write that waits without moving for `write-timeout`, or that runs past `write-timeout` plus
//! its size at `min-send-rate`, ends the connection (or the HTTP/2 stream). A write that has
//! waited `evict-stalled-after` puts its connection on the listener's [`Stalled`] list: at the
//! connection cap, a new connection closes the one that has waited longest instead of being
//! turned away.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use sluice_config::ConnectionLimits;

/// The write bounds of one listener (`*.connections.write-timeout`, `min-send-rate`,
/// `max-unsent-bytes`, `evict-stalled-after`).
#[derive(Debug, Clone, Copy)]
pub struct WriteLimits {
    /// Longest a write may wait without a byte moving.
    pub timeout: Duration,
    /// Slowest rate an answer may be taken at, bytes a second (at least 1).
    pub min_rate: u64,
    /// Unsent answer bytes one connection may hold across its streams.
    pub max_unsent: usize,
    /// How long a write waits before its connection may be closed for a new one at the cap.
    pub evict_after: Duration,
}

impl WriteLimits {
    /// The bounds `limits` sets.
    pub fn of(limits: &ConnectionLimits) -> Self {
        Self {
            timeout: limits.write_timeout.0,
            min_rate: limits.min_send_rate.0.max(1),
            max_unsent: usize::try_from(limits.max_unsent_bytes.0).unwrap_or(usize::MAX),
            evict_after: limits.evict_stalled_after.0.min(limits.write_timeout.0),
        }
    }

    /// When writing an answer of `len` bytes, started now, must be done.
    pub fn deadline(&self, len: usize) -> Instant {
        let at_rate = Duration::from_secs_f64(len as f64 / self.min_rate as f64);
        Instant::now() + self.timeout + at_rate
    }
}

/// One connection's answers on their way out.
#[derive(Debug)]
pub struct Writes {
    opened: Instant,
    /// The client's address, for the per-address cap's eviction.
    peer: Option<IpAddr>,
    /// Milliseconds after `opened` at which answer bytes last moved.
    moved_ms: AtomicU64,
    /// Answers being written now.
    writing: AtomicUsize,
    /// Answer bytes handed to this connection and not yet written.
    unsent: AtomicUsize,
    /// On the listener's stalled list already.
    listed: AtomicBool,
    /// Told to close: the connection ends as soon as it sees it.
    close: Notify,
    /// An answer began to wait for its client (for a connection that watches its writes).
    started: Notify,
}

impl Writes {
    /// A connection from `peer`, opened now.
    pub fn new(peer: Option<IpAddr>) -> Arc<Self> {
        Arc::new(Self {
            opened: Instant::now(),
            peer,
            moved_ms: AtomicU64::new(0),
            writing: AtomicUsize::new(0),
            unsent: AtomicUsize::new(0),
            listed: AtomicBool::new(false),
            close: Notify::new(),
            started: Notify::new(),
        })
    }

    /// Answer bytes moved to the client.
    pub fn moved(&self) {
        let now = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.moved_ms.store(now, Ordering::Relaxed);
    }

    /// How long answers have waited without a byte moving; `None` when none is being written.
    pub fn stalled_for(&self) -> Option<Duration> {
        if self.writing.load(Ordering::Acquire) == 0 {
            return None;
        }
        let moved = self.opened + Duration::from_millis(self.moved_ms.load(Ordering::Relaxed));
        Some(Instant::now().saturating_duration_since(moved))
    }

    /// Counts an answer being written until the guard drops. The first write starts the
    /// stall clock afresh: the time before it was the handler's, not the client's.
    pub fn writing(self: &Arc<Self>) -> Writing {
        if self.writing.fetch_add(1, Ordering::AcqRel) == 0 {
            self.moved();
            self.started.notify_one();
        }
        Writing(Arc::clone(self))
    }

    /// Returns once an answer began to wait for its client (at once if one did since the last
    /// call).
    pub async fn started_writing(&self) {
        self.started.notified().await;
    }

    /// Takes `len` answer bytes into the unsent count, unless the connection holds others and
    /// they would go past `max`: `None` then. One answer alone is always taken.
    pub fn hold(self: &Arc<Self>, len: usize, max: usize) -> Option<Unsent> {
        let before = self.unsent.fetch_add(len, Ordering::AcqRel);
        if before > 0 && before.saturating_add(len) > max {
            self.unsent.fetch_sub(len, Ordering::AcqRel);
            return None;
        }
        Some(Unsent {
            writes: Arc::clone(self),
            left: len,
        })
    }

    /// Answer bytes handed to the connection and not yet written.
    pub fn unsent(&self) -> usize {
        self.unsent.load(Ordering::Acquire)
    }

    /// Tells the connection to close.
    pub fn close(&self) {
        self.close.notify_one();
    }

    /// Returns once the connection is told to close.
    pub async fn closing(&self) {
        self.close.notified().await;
    }
}

/// An answer being written (see [`Writes::writing`]).
#[derive(Debug)]
pub struct Writing(Arc<Writes>);

impl Drop for Writing {
    fn drop(&mut self) {
        self.0.writing.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An answer's bytes not yet written (see [`Writes::hold`]); what is left is given back when
/// it drops.
#[derive(Debug)]
pub struct Unsent {
    writes: Arc<Writes>,
    left: usize,
}

impl Unsent {
    /// `n` more bytes were written.
    pub fn sent(&mut self, n: usize) {
        let n = n.min(self.left);
        self.left -= n;
        self.writes.unsent.fetch_sub(n, Ordering::AcqRel);
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        self.writes.unsent.fetch_sub(self.left, Ordering::AcqRel);
    }
}

/// How long a new connection waits for the place an evicted connection gives back.
pub const EVICTED_GIVES_BACK: Duration = Duration::from_secs(1);

/// A place under a cap (`take`) once an evicted connection gives its own back; `None` if it
/// does not within [`EVICTED_GIVES_BACK`].
pub async fn given_back<P>(take: impl Fn() -> Option<P>) -> Option<P> {
    let wait = async {
        loop {
            if let Some(place) = take() {
                return place;
            }
            // The evicted connection's task ends within a few polls; the caps have no waiters
            // of their own to wake this one, and this runs only at a full cap.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(EVICTED_GIVES_BACK, wait).await.ok()
}

/// One listener's connections whose answers have waited for their clients.
#[derive(Debug, Default)]
pub struct Stalled {
    listed: Mutex<Vec<Weak<Writes>>>,
}

impl Stalled {
    /// An empty list.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Puts `writes`' connection on the list (once).
    pub fn list(&self, writes: &Arc<Writes>) {
        if writes.listed.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut listed = self.listed.lock().unwrap_or_else(|e| e.into_inner());
        // The list holds at most one entry per open connection.
        listed.retain(|w| w.strong_count() > 0);
        listed.push(Arc::downgrade(writes));
    }

    /// Tells the connection whose answer has waited longest, at least `after`, to close; from
    /// `peer` only when given. Answers whether one was told.
    pub fn evict(&self, after: Duration, peer: Option<IpAddr>) -> bool {
        let mut listed = self.listed.lock().unwrap_or_else(|e| e.into_inner());
        listed.retain(|w| w.strong_count() > 0);
        let longest = listed
            .iter()
            .enumerate()
            .filter_map(|(i, w)| {
                let writes = w.upgrade()?;
                if peer.is_some() && writes.peer != peer {
                    return None;
                }
                let waited = writes.stalled_for().filter(|d| *d >= after)?;
                Some((i, waited, writes))
            })
            .max_by_key(|(_, waited, _)| *waited);
        let Some((i, waited, writes)) = longest else {
            return false;
        };
        listed.swap_remove(i);
        writes.listed.store(false, Ordering::Release);
        tracing::debug!(
            ?waited,
            "connection cap reached: closing the connection whose answer waited longest for its client (connections.evict-stalled-after)"
        );
        writes.close();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_stalled_write_is_evicted_longest_first_and_only_past_its_wait() {
        let stalled = Stalled::new();
        let loopback: IpAddr = [127, 0, 0, 1].into();
        let first = Writes::new(Some(loopback));
        let second = Writes::new(Some([10, 0, 0, 1].into()));
        let idle = Writes::new(Some(loopback));
        let _writing_first = first.writing();
        tokio::time::advance(Duration::from_millis(500)).await;
        let _writing_second = second.writing();
        stalled.list(&first);
        stalled.list(&second);
        stalled.list(&first);
        stalled.list(&idle);
        assert!(
            !stalled.evict(Duration::from_secs(1), None),
            "none waited 1 s"
        );
        tokio::time::advance(Duration::from_millis(600)).await;
        assert_eq!(first.stalled_for(), Some(Duration::from_millis(1100)));
        assert_eq!(idle.stalled_for(), None, "writes nothing");
        assert!(stalled.evict(Duration::from_secs(1), None));
        tokio::time::timeout(Duration::from_millis(1), first.closing())
            .await
            .expect("the longest waiting one is told to close");
        // Of 10.0.0.1's connections only; the second waited only 600 ms.
        assert!(!stalled.evict(Duration::from_secs(1), Some([10, 0, 0, 1].into())));
        tokio::time::advance(Duration::from_millis(400)).await;
        assert!(!stalled.evict(Duration::from_secs(1), Some(loopback)));
        assert!(stalled.evict(Duration::from_secs(1), Some([10, 0, 0, 1].into())));
        second.moved();
        assert!(!stalled.evict(Duration::ZERO, None), "the list is empty");
    }

    #[test]
    fn a_connection_holds_one_answer_of_any_size_and_others_up_to_its_cap() {
        let writes = Writes::new(None);
        let mut big = writes.hold(10_000, 100).expect("alone, any size");
        assert!(writes.hold(1, 100).is_none(), "past the cap beside it");
        big.sent(9_950);
        let small = writes.hold(50, 100).expect("50 + 50 fit");
        drop(big);
        drop(small);
        assert_eq!(writes.unsent.load(Ordering::Acquire), 0);
    }

    #[test]
    fn an_answers_deadline_grows_with_its_size_at_the_minimum_rate() {
        let limits = WriteLimits {
            timeout: Duration::from_secs(10),
            min_rate: 1024,
            max_unsent: 0,
            evict_after: Duration::from_secs(1),
        };
        let now = Instant::now();
        let deadline = limits.deadline(10 * 1024);
        assert!(deadline >= now + Duration::from_secs(20));
        assert!(deadline < now + Duration::from_secs(21));
    }
}
