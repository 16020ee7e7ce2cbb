//! A TCP link a test can cut: a forwarder on a loopback port to another, on a thread of its
//! own (its runtime goes on while a test blocks). Cut, it goes silent as a network partition
//! does: connections through it stay open but carry nothing, in either direction, and new
//! ones are taken but never answered, so the peers find out only by their own timeouts.
//! Mended, it drops what it held (the peers reconnect) and forwards again. It counts the bytes
//! it carries each way, so a test reads what one client took in from the brokers.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Links that are cut and mended together (every broker as one node sees it).
pub struct Links {
    cut: watch::Sender<bool>,
    /// The forwarders' addresses, in the order their targets were given.
    pub addresses: Vec<SocketAddr>,
    counted: Arc<Counted>,
    _thread: std::thread::JoinHandle<()>,
}

/// Bytes carried through a set of links.
#[derive(Debug, Default)]
pub struct Counted {
    /// From the client to the targets.
    sent: AtomicU64,
    /// From the targets to the client.
    received: AtomicU64,
}

impl Links {
    /// Forwarders from `listeners` (bound already, so their ports are known before the
    /// targets start) to `targets`, one to one.
    pub fn start(listeners: Vec<std::net::TcpListener>, targets: Vec<SocketAddr>) -> Self {
        let (cut, is_cut) = watch::channel(false);
        let counted = Arc::new(Counted::default());
        let counting = Arc::clone(&counted);
        let addresses = listeners
            .iter()
            .map(|l| l.local_addr().expect("a bound listener"))
            .collect();
        let thread = std::thread::Builder::new()
            .name("test-links".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime for the links");
                runtime.block_on(async move {
                    let mut tasks = tokio::task::JoinSet::new();
                    for (listener, target) in listeners.into_iter().zip(targets) {
                        listener
                            .set_nonblocking(true)
                            .expect("a non-blocking listener");
                        let listener = TcpListener::from_std(listener).expect("a tokio listener");
                        tasks.spawn(accept(
                            listener,
                            target,
                            is_cut.clone(),
                            Arc::clone(&counting),
                        ));
                    }
                    // Until the test drops the links (the sender goes).
                    let mut closed = is_cut;
                    while closed.changed().await.is_ok() {}
                    tasks.abort_all();
                });
            })
            .expect("the links' thread");
        Self {
            cut,
            addresses,
            counted,
            _thread: thread,
        }
    }

    /// The bytes carried so far: (from the client, to the client).
    pub fn carried(&self) -> (u64, u64) {
        (
            self.counted.sent.load(Ordering::Relaxed),
            self.counted.received.load(Ordering::Relaxed),
        )
    }

    /// Silences every connection through the links, and new ones.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Forwards again.
    pub fn mend(&self) {
        self.cut.send_replace(false);
    }
}

async fn accept(
    listener: TcpListener,
    target: SocketAddr,
    is_cut: watch::Receiver<bool>,
    counted: Arc<Counted>,
) {
    while let Ok((inbound, _)) = listener.accept().await {
        let mut is_cut = is_cut.clone();
        let counted = Arc::clone(&counted);
        tokio::spawn(async move {
            let mut inbound = inbound;
            if !*is_cut.borrow() {
                let Ok(outbound) = TcpStream::connect(target).await else {
                    return;
                };
                let mut outbound = Counting {
                    inner: outbound,
                    counted,
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => return,
                    _ = is_cut.wait_for(|cut| *cut) => {}
                }
            }
            // Cut: held open and silent until mended, then closed.
            let _ = is_cut.wait_for(|cut| !*cut).await;
            drop(inbound);
        });
    }
}

/// The target's side of a link, counting what passes: read from it goes to the client, written
/// to it came from the client.
struct Counting {
    inner: TcpStream,
    counted: Arc<Counted>,
}

impl AsyncRead for Counting {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = (buf.filled().len() - before) as u64;
        self.counted.received.fetch_add(read, Ordering::Relaxed);
        polled
    }
}

impl AsyncWrite for Counting {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(written)) = &polled {
            self.counted
                .sent
                .fetch_add(*written as u64, Ordering::Relaxed);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
