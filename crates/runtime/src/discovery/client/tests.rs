use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Router;
use axum::response::IntoResponse;
use axum::routing::get;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;

use super::*;

const V3: &str = "application/vnd.restate.endpointmanifest.v3+json";

fn manifest(mode: &str, min: i32, max: i32) -> String {
    serde_json::json!({
        "protocolMode": mode,
        "minProtocolVersion": min,
        "maxProtocolVersion": max,
        "services": [{"name": "Greeter", "ty": "SERVICE", "handlers": [{"name": "greet"}]}]
    })
    .to_string()
}

fn answering(content_type: &'static str, body: String) -> Router {
    Router::new().route(
        "/discover",
        get(move || async move {
            (
                [
                    (header::CONTENT_TYPE, content_type),
                    (HeaderName::from_static("x-restate-server"), "test-sdk/1.0"),
                ],
                body,
            )
        }),
    )
}

/// Serves HTTP/1.1 and HTTP/2 with prior knowledge, like the SDKs' HTTP/2 servers.
async fn serve_auto(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

/// Serves HTTP/1.1 only.
async fn serve_http1(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let service = TowerToHyperService::new(router.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

fn request(addr: SocketAddr, path: &str, use_http_11: bool) -> DiscoveryRequest {
    DiscoveryRequest {
        uri: format!("http://{addr}{path}").parse().unwrap(),
        additional_headers: BTreeMap::from([("x-token".to_owned(), "secret".to_owned())]),
        use_http_11,
    }
}

fn client() -> DiscoveryClient {
    DiscoveryClient::new(3, Duration::from_millis(10), Duration::from_secs(5))
}

#[tokio::test]
async fn discovers_over_h2c_with_headers_and_prefix() {
    let router = Router::new().route(
        "/prefix/discover",
        get(|headers: http::HeaderMap| async move {
            let accept = headers[header::ACCEPT].to_str().unwrap().to_owned();
            assert!(accept.contains("endpointmanifest.v4+json") && accept.contains("v1+json"));
            assert_eq!(headers["x-token"], "secret");
            ([(header::CONTENT_TYPE, V3)], manifest("BIDI_STREAM", 5, 7)).into_response()
        }),
    );
    let addr = serve_auto(router).await;
    let found = client()
        .discover(&request(addr, "/prefix/", false))
        .await
        .unwrap();
    assert_eq!(found.http_version, HttpVersion::Http2);
    assert_eq!(found.manifest_version, 3);
    assert_eq!(found.manifest.services[0].name, "Greeter");
}

#[tokio::test]
async fn discovers_over_http11_when_asked() {
    let addr = serve_http1(answering(V3, manifest("REQUEST_RESPONSE", 5, 6))).await;
    let found = client().discover(&request(addr, "", true)).await.unwrap();
    assert_eq!(found.http_version, HttpVersion::Http11);
    assert_eq!(found.sdk_version.as_deref(), Some("test-sdk/1.0"));
}

#[tokio::test]
async fn h2c_against_an_http11_only_server_is_meta0014() {
    let addr = serve_http1(answering(V3, manifest("REQUEST_RESPONSE", 5, 7))).await;
    let err = client()
        .discover(&request(addr, "", false))
        .await
        .unwrap_err();
    assert_eq!(err.code, Some(Code::META0014), "{err}");
    assert!(err.message.contains("use_http_11"), "{err}");
}

#[tokio::test]
async fn bidi_over_http11_is_meta0015() {
    let addr = serve_http1(answering(V3, manifest("BIDI_STREAM", 5, 7))).await;
    let err = client()
        .discover(&request(addr, "", true))
        .await
        .unwrap_err();
    assert_eq!(err.code, Some(Code::META0015), "{err}");
}

#[tokio::test]
async fn an_old_range_is_meta0012_and_a_missing_mode_meta0013() {
    let addr = serve_auto(answering(V3, manifest("BIDI_STREAM", 1, 3))).await;
    let err = client()
        .discover(&request(addr, "", false))
        .await
        .unwrap_err();
    assert_eq!(err.code, Some(Code::META0012), "{err}");

    let no_mode = r#"{"minProtocolVersion":5,"maxProtocolVersion":7,"services":[]}"#.to_owned();
    let addr = serve_auto(answering(V3, no_mode)).await;
    let err = client()
        .discover(&request(addr, "", false))
        .await
        .unwrap_err();
    assert_eq!(err.code, Some(Code::META0013), "{err}");
}

#[tokio::test]
async fn a_wrong_content_type_is_meta0013() {
    let addr = serve_auto(answering("application/json", manifest("BIDI_STREAM", 5, 7))).await;
    let err = client()
        .discover(&request(addr, "", false))
        .await
        .unwrap_err();
    assert_eq!(err.code, Some(Code::META0013), "{err}");
    assert!(err.message.contains("'application/json'"), "{err}");
}

#[tokio::test]
async fn not_found_and_unreachable_are_meta0003() {
    let addr = serve_auto(Router::new()).await;
    let err = client()
        .discover(&request(addr, "/wrong", false))
        .await
        .unwrap_err();
    assert_eq!(err.code, Some(Code::META0003), "{err}");
    assert!(err.message.contains("'404'"), "{err}");

    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let err = client()
        .discover(&request(closed, "", false))
        .await
        .unwrap_err();
    assert_eq!(err.code, Some(Code::META0003), "{err}");
    assert!(
        err.message.contains(&format!("http://{closed}/discover")),
        "{err}"
    );
}

#[tokio::test]
async fn transient_statuses_are_retried() {
    let calls = Arc::new(AtomicU32::new(0));
    let seen = Arc::clone(&calls);
    let router = Router::new().route(
        "/discover",
        get(move || {
            let seen = Arc::clone(&seen);
            async move {
                if seen.fetch_add(1, Ordering::SeqCst) < 2 {
                    (StatusCode::SERVICE_UNAVAILABLE, "warming up").into_response()
                } else {
                    ([(header::CONTENT_TYPE, V3)], manifest("BIDI_STREAM", 5, 7)).into_response()
                }
            }
        }),
    );
    let addr = serve_auto(router).await;
    client().discover(&request(addr, "", false)).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[test]
fn urls_keep_prefix_and_query() {
    let url = |s: &str| discover_url(&s.parse().unwrap());
    assert_eq!(url("http://h:1").unwrap(), "http://h:1/discover");
    assert_eq!(url("http://h:1/a/b/").unwrap(), "http://h:1/a/b/discover");
    assert_eq!(
        url("http://h:1/a?x=1").unwrap(),
        "http://h:1/a/discover?x=1"
    );
    assert_eq!(url("https://h/").unwrap(), "https://h/discover");
    assert_eq!(url("ftp://h/").unwrap_err().code, Some(Code::META0003));
}

/// A TLS endpoint with a self-signed certificate: the client must really handshake, and refuse
/// a certificate no trusted CA signed.
#[tokio::test]
async fn https_endpoints_are_reached_over_tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let handshakes = Arc::new(AtomicU32::new(0));
    let seen = Arc::clone(&handshakes);
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                // The client aborts on the unknown issuer; reaching the handshake is the point.
                seen.fetch_add(1, Ordering::SeqCst);
                let _ = acceptor.accept(stream).await;
            });
        }
    });
    let req = DiscoveryRequest {
        uri: format!("https://localhost:{port}/").parse().unwrap(),
        additional_headers: BTreeMap::new(),
        use_http_11: false,
    };
    let err = client().discover(&req).await.unwrap_err();
    assert_eq!(err.code, Some(Code::META0003), "{err}");
    assert!(err.message.to_lowercase().contains("certificate"), "{err}");
    assert!(handshakes.load(Ordering::SeqCst) >= 1);
}
