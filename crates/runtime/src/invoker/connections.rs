//! What an attempt client knows of each deployment address: its request-head template (scheme,
//! authority and base path, parsed once, not per attempt) and, for HTTP/2 deployments, its one
//! connection on the `h2` crate. An attempt client serves one shard, so every attempt of that
//! shard shares the connection and the connection's task runs on the shard with them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::client::SendRequest;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Request, Uri, Version};
use hyper_util::rt::TokioIo;

use crate::deployment_tls::Connector;

/// Most addresses remembered; past it the map starts over (attempts in flight keep their
/// connection; the next ones open new ones). Deployments are few: this only bounds a registry
/// churning through addresses.
const MOST_ADDRESSES: usize = 1024;

/// The HTTP/2 window Sluice offers a deployment per stream and per connection: a stream's
/// messages (up to `message-size-limit` each) flow without waiting for a window update.
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;

/// Largest response head a deployment may send (HPACK-decoded): a protocol answer's head is a
/// status and a few short headers. A larger one fails the attempt (RT0010).
const MOST_HEADER_BYTES: u32 = 16 * 1024;

/// One deployment address.
#[derive(Debug)]
pub(super) struct Address {
    scheme: Scheme,
    authority: Authority,
    /// The base path without its trailing `/`.
    base_path: String,
    /// What the connector dials: scheme and authority.
    dial: Uri,
    /// The HTTP/2 connection, once opened. The lock is held while one attempt connects, so
    /// attempts arriving meanwhile share that connection instead of opening their own.
    h2: tokio::sync::Mutex<Option<Open>>,
}

/// An open HTTP/2 connection.
#[derive(Debug, Clone)]
struct Open {
    /// Each new connection gets the next generation, so an attempt that saw one fail knows
    /// whether the one there now is another.
    generation: u64,
    sender: SendRequest<Bytes>,
    /// When an attempt last took a stream on it.
    used: Instant,
}

/// Why no stream could be opened.
#[derive(Debug)]
pub(super) enum OpenError {
    /// No connection could be made (refused, unresolvable, no TLS handshake).
    Connect(String),
    /// The connection was made but refused the stream.
    Stream(h2::Error),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Connect(e) => write!(f, "{e}"),
            Self::Stream(e) => write!(f, "{e}"),
        }
    }
}

impl Address {
    /// `uri` parsed; `None` when it is no absolute `http(s)://` URI.
    fn parse(uri: &str) -> Option<Self> {
        let parsed: Uri = uri.parse().ok()?;
        let scheme = parsed.scheme()?.clone();
        if scheme != Scheme::HTTP && scheme != Scheme::HTTPS {
            return None;
        }
        let authority = parsed.authority()?.clone();
        let dial = Uri::builder()
            .scheme(scheme.clone())
            .authority(authority.clone())
            .path_and_query("/")
            .build()
            .ok()?;
        Some(Self {
            scheme,
            authority,
            base_path: parsed.path().trim_end_matches('/').to_owned(),
            dial,
            h2: tokio::sync::Mutex::new(None),
        })
    }

    /// The head of `POST {base}/invoke/{service}/{handler}`, without headers; `None` when the
    /// names make no valid path.
    pub(super) fn invoke(
        &self,
        service: &str,
        handler: &str,
        version: Version,
    ) -> Option<Request<()>> {
        let mut path =
            String::with_capacity(self.base_path.len() + 9 + service.len() + handler.len());
        path.push_str(&self.base_path);
        path.push_str("/invoke/");
        path.push_str(service);
        path.push('/');
        path.push_str(handler);
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(PathAndQuery::from_maybe_shared(Bytes::from(path)).ok()?);
        let mut request = Request::new(());
        *request.method_mut() = Method::POST;
        *request.uri_mut() = Uri::from_parts(parts).ok()?;
        *request.version_mut() = version;
        Some(request)
    }

    /// A sender ready for one more stream on this address's HTTP/2 connection, opening the
    /// connection if there is none, the last one closed (a connection that went away between
    /// two attempts is replaced, as a pool would), or it sat unused for `idle` (a load
    /// balancer may have dropped it without a word; a fresh one costs a handshake, a dead one
    /// an attempt's abort timeout). Waiting for a stream slot (the deployment's
    /// concurrent-stream limit) happens outside the lock.
    pub(super) async fn ready(
        &self,
        connector: &Connector,
        idle: Duration,
    ) -> Result<SendRequest<Bytes>, OpenError> {
        let mut failed = None;
        for _ in 0..3 {
            let current = {
                let mut slot = self.h2.lock().await;
                let now = Instant::now();
                if slot
                    .as_ref()
                    .is_some_and(|open| now.duration_since(open.used) > idle)
                {
                    // Dropping the last sender ends the connection's task.
                    *slot = None;
                }
                slot.as_mut().map(|open| {
                    open.used = now;
                    (open.generation, open.sender.clone())
                })
            };
            if let Some((generation, sender)) = current
                && failed != Some(generation)
            {
                match sender.ready().await {
                    Ok(sender) => return Ok(sender),
                    Err(_) => {
                        failed = Some(generation);
                        continue;
                    }
                }
            }
            let mut slot = self.h2.lock().await;
            // Another attempt replaced the failed connection meanwhile: use that one.
            if slot
                .as_ref()
                .is_some_and(|open| failed != Some(open.generation))
            {
                continue;
            }
            let sender = self.connect(connector).await?;
            let generation = slot.as_ref().map_or(0, |open| open.generation + 1);
            *slot = Some(Open {
                generation,
                sender: sender.clone(),
                used: Instant::now(),
            });
            drop(slot);
            return sender.ready().await.map_err(OpenError::Stream);
        }
        Err(OpenError::Connect(
            "its connections kept closing as they were opened".to_owned(),
        ))
    }

    async fn connect(&self, connector: &Connector) -> Result<SendRequest<Bytes>, OpenError> {
        let mut connector = connector.clone();
        let io = tower::Service::call(&mut connector, self.dial.clone())
            .await
            .map_err(|e| OpenError::Connect(e.to_string()))?;
        let (sender, connection) = h2::client::Builder::new()
            .enable_push(false)
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_header_list_size(MOST_HEADER_BYTES)
            .handshake::<_, Bytes>(TokioIo::new(io))
            .await
            .map_err(|e| OpenError::Connect(e.to_string()))?;
        let authority = self.authority.clone();
        // The connection's frames are read and written by this task, on the shard that opened
        // it; it ends when the deployment closes it or every sender is gone.
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(deployment = %authority, %error, "a deployment connection ended");
            }
        });
        Ok(sender)
    }
}

/// The addresses one attempt client has reached.
#[derive(Debug, Default)]
pub(super) struct Addresses {
    known: Mutex<HashMap<String, Arc<Address>>>,
}

impl Addresses {
    /// The address of the deployment at `uri`; `None` when `uri` does not parse.
    pub(super) fn get(&self, uri: &str) -> Option<Arc<Address>> {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(address) = known.get(uri) {
            return Some(Arc::clone(address));
        }
        let address = Arc::new(Address::parse(uri)?);
        if known.len() >= MOST_ADDRESSES {
            known.clear();
        }
        known.insert(uri.to_owned(), Arc::clone(&address));
        Some(address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_path_prefixes_the_invoke_path_and_bad_uris_are_refused() {
        let addresses = Addresses::default();
        let address = addresses.get("http://127.0.0.1:9080/base/").unwrap();
        let head = address.invoke("Greeter", "greet", Version::HTTP_2).unwrap();
        assert_eq!(
            head.uri(),
            "http://127.0.0.1:9080/base/invoke/Greeter/greet"
        );
        assert_eq!(head.method(), Method::POST);
        let root = addresses.get("https://example.com").unwrap();
        let head = root.invoke("A", "b", Version::HTTP_11).unwrap();
        assert_eq!(head.uri(), "https://example.com/invoke/A/b");
        assert!(root.invoke("A b", "c", Version::HTTP_2).is_none());
        assert!(addresses.get("not a uri").is_none());
        assert!(addresses.get("ftp://example.com/").is_none());
        assert!(addresses.get("/relative").is_none());
        // The same text is the same address (one connection).
        assert!(Arc::ptr_eq(
            &address,
            &addresses.get("http://127.0.0.1:9080/base/").unwrap()
        ));
    }
}
