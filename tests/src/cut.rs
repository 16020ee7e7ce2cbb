//! A TCP link a test can cut: a forwarder on a loopback port to another, on a thread of its
//! own (its runtime goes on while a test blocks). Cut, it goes silent as a network partition
//! does: connections through it stay open but carry nothing, in either direction, and new
//! ones are taken but never answered, so the peers find out only by their own timeouts.
//! Mended, it drops what it held (the peers reconnect) and forwards again.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Links that are cut and mended together (every broker as one node sees it).
pub struct Links {
    cut: watch::Sender<bool>,
    /// The forwarders' addresses, in the order their targets were given.
    pub addresses: Vec<SocketAddr>,
    _thread: std::thread::JoinHandle<()>,
}

impl Links {
    /// Forwarders from `listeners` (bound already, so their ports are known before the
    /// targets start) to `targets`, one to one.
    pub fn start(listeners: Vec<std::net::TcpListener>, targets: Vec<SocketAddr>) -> Self {
        let (cut, is_cut) = watch::channel(false);
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
                        tasks.spawn(accept(listener, target, is_cut.clone()));
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
            _thread: thread,
        }
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

async fn accept(listener: TcpListener, target: SocketAddr, is_cut: watch::Receiver<bool>) {
    while let Ok((inbound, _)) = listener.accept().await {
        let mut is_cut = is_cut.clone();
        tokio::spawn(async move {
            let mut inbound = inbound;
            if !*is_cut.borrow() {
                let Ok(mut outbound) = TcpStream::connect(target).await else {
                    return;
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
