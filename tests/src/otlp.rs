//! An OTLP/HTTP receiver that collects the spans a server exports.

/// A small OTLP/HTTP trace receiver (JSON encoding) on loopback: what Sluice exports with
/// `tracing.protocol = "http/json"` lands in [`OtlpReceiver::spans`].
pub struct OtlpReceiver {
    /// `http://127.0.0.1:<port>/v1/traces`.
    pub endpoint: String,
    spans: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl OtlpReceiver {
    /// Listens on a free loopback port.
    pub async fn start() -> Self {
        use axum::routing::post;
        let spans: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>> = Default::default();
        let seen = std::sync::Arc::clone(&spans);
        let router = axum::Router::new().route(
            "/v1/traces",
            post(move |body: bytes::Bytes| {
                let seen = std::sync::Arc::clone(&seen);
                async move {
                    let request: serde_json::Value = match serde_json::from_slice(&body) {
                        Ok(request) => request,
                        Err(_) => return (axum::http::StatusCode::BAD_REQUEST, "{}"),
                    };
                    let mut seen = seen.lock().unwrap();
                    for resource in request["resourceSpans"].as_array().into_iter().flatten() {
                        for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                            for span in scope["spans"].as_array().into_iter().flatten() {
                                let mut span = span.clone();
                                span["resource"] = resource["resource"].clone();
                                seen.push(span);
                            }
                        }
                    }
                    (axum::http::StatusCode::OK, "{}")
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Self {
            endpoint: format!("http://{addr}/v1/traces"),
            spans,
            task,
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<serde_json::Value> {
        self.spans.lock().unwrap().clone()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}
