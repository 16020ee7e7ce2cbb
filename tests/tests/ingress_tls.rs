//! The ingress over TLS (`ingress.tls-cert-file`, `ingress.tls-key-file`): HTTP/1.1 and h2 by
//! ALPN, a handshake bounded by the header-read timeout, and the certificate reloaded on SIGHUP
//! or a file change while open connections go on.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName};
use sluice_tests::{Sluice, TestDeployment, closed_within, get_json};
use tokio::net::TcpStream;

/// A self-signed certificate for localhost, written to `dir/{name}.crt|key`: its DER.
fn certificate(dir: &Path, name: &str) -> CertificateDer<'static> {
    let cert =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap();
    std::fs::write(dir.join(format!("{name}.crt")), cert.cert.pem()).unwrap();
    std::fs::write(
        dir.join(format!("{name}.key")),
        cert.signing_key.serialize_pem(),
    )
    .unwrap();
    cert.cert.der().clone()
}

/// Puts certificate `name` where the server reads its certificate from (key first, then the
/// chain, each by rename so the server never reads half a file).
fn install(dir: &Path, name: &str) {
    for (ext, target) in [("key", "server.key"), ("crt", "server.crt")] {
        let staged = dir.join(format!("{target}.new"));
        std::fs::copy(dir.join(format!("{name}.{ext}")), &staged).unwrap();
        std::fs::rename(&staged, dir.join(target)).unwrap();
    }
}

/// An open HTTPS connection.
enum Conn {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

impl Conn {
    /// Connects trusting only `trusted`, offering h2 or only HTTP/1.1; `None` when the
    /// handshake fails (an untrusted certificate).
    async fn open(port: u16, trusted: &CertificateDer<'static>, h2: bool) -> Option<Conn> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(trusted.clone()).unwrap();
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = if h2 {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .ok()?;
        let negotiated_h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
        assert_eq!(
            negotiated_h2, h2,
            "ALPN picks what the client offered first"
        );
        let io = TokioIo::new(tls);
        Some(if h2 {
            let (send, conn) = http2::handshake(TokioExecutor::new(), io).await.unwrap();
            tokio::spawn(conn);
            Conn::H2(send)
        } else {
            let (send, conn) = http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            Conn::H1(send)
        })
    }

    /// Calls `Greeter/greet` with `name`: status and body.
    async fn greet(&mut self, name: &str) -> (u16, String) {
        let request = hyper::Request::post("https://localhost/Greeter/greet")
            .header("content-type", "application/json")
            .header("host", "localhost")
            .body(Full::new(Bytes::from(format!("\"{name}\""))))
            .unwrap();
        let response = match self {
            Conn::H1(send) => send.send_request(request).await.unwrap(),
            Conn::H2(send) => send.send_request(request).await.unwrap(),
        };
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }
}

#[tokio::test]
async fn the_ingress_speaks_tls_by_alpn_and_reloads_its_certificate_without_dropping_connections() {
    let dir = tempfile::tempdir().unwrap();
    let first = certificate(dir.path(), "first");
    let second = certificate(dir.path(), "second");
    let third = certificate(dir.path(), "third");
    install(dir.path(), "first");
    let dep = TestDeployment::start("v1").await.unwrap();
    let mut sluice = Sluice::builder()
        .ingress_tls(
            &dir.path().join("server.crt"),
            &dir.path().join("server.key"),
        )
        .config("[ingress.connections]\nheader-read-timeout = \"1s\"\n")
        .start()
        .await
        .unwrap();
    sluice.register(&dep.uri, false).await;
    let port: u16 = sluice
        .ingress_url
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let (_, version) = get_json(&format!("{}/version", sluice.admin_url)).await;
    assert!(
        version["ingress_endpoint"]
            .as_str()
            .unwrap()
            .starts_with("https://"),
        "{version}"
    );

    // HTTP/1.1 and h2, each by ALPN.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut h1 = loop {
        if let Some(conn) = Conn::open(port, &first, false).await {
            break conn;
        }
        assert!(Instant::now() < deadline, "the TLS ingress never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(h1.greet("Ada").await, (200, "\"Hello, Ada!\"".into()));
    let mut h2 = Conn::open(port, &first, true).await.unwrap();
    assert_eq!(h2.greet("Bo").await, (200, "\"Hello, Bo!\"".into()));

    // Plain HTTP gets no answer, and a handshake that never comes is cut at the header-read
    // timeout.
    let plain = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/Greeter/greet"))
        .header("content-type", "application/json")
        .body("\"Cy\"")
        .send()
        .await;
    assert!(plain.is_err(), "{plain:?}");
    let mut silent = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    assert!(
        closed_within(&mut silent, Duration::from_secs(5)).await,
        "a silent connection stays open"
    );

    // SIGHUP: new handshakes get the second certificate; the open connections go on.
    install(dir.path(), "second");
    sluice.signal(nix::sys::signal::Signal::SIGHUP).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut renewed = loop {
        if let Some(conn) = Conn::open(port, &second, true).await {
            break conn;
        }
        assert!(
            Instant::now() < deadline,
            "the second certificate never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(renewed.greet("Di").await, (200, "\"Hello, Di!\"".into()));
    assert!(
        Conn::open(port, &first, true).await.is_none(),
        "the first certificate is no longer served"
    );
    assert_eq!(h1.greet("Ed").await, (200, "\"Hello, Ed!\"".into()));
    assert_eq!(h2.greet("Flo").await, (200, "\"Hello, Flo!\"".into()));

    // A file change alone reloads too.
    install(dir.path(), "third");
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut latest = loop {
        if let Some(conn) = Conn::open(port, &third, false).await {
            break conn;
        }
        assert!(
            Instant::now() < deadline,
            "the changed files were never read"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(latest.greet("Gus").await, (200, "\"Hello, Gus!\"".into()));
    assert_eq!(h2.greet("Hal").await, (200, "\"Hello, Hal!\"".into()));
    // A broken file keeps the certificate served, and the process serving.
    std::fs::write(dir.path().join("server.crt"), "not a certificate").unwrap();
    sluice.signal(nix::sys::signal::Signal::SIGHUP).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    sluice
        .until_said(
            "did not reload",
            deadline,
            "the broken file was never reported",
        )
        .await;
    let mut still = Conn::open(port, &third, true).await.unwrap();
    assert_eq!(still.greet("Ivy").await, (200, "\"Hello, Ivy!\"".into()));
}

#[test]
fn a_certificate_without_its_key_or_a_key_that_is_not_its_own_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    certificate(dir.path(), "one");
    certificate(dir.path(), "two");
    let done = Sluice::builder()
        .env(
            "SERVICE_INGRESS__TLS_CERT_FILE",
            &dir.path().join("one.crt").display().to_string(),
        )
        .run_to_exit()
        .unwrap();
    assert!(!done.status.success());
    assert!(done.stderr.contains("go together"), "{}", done.stderr);
    let done = Sluice::builder()
        .ingress_tls(&dir.path().join("one.crt"), &dir.path().join("two.key"))
        .run_to_exit()
        .unwrap();
    assert!(!done.status.success());
    assert!(
        done.stderr.contains("not the certificate's") && done.stderr.contains("RT0002"),
        "{}",
        done.stderr
    );
}

#[tokio::test]
async fn sighup_reloads_the_admin_certificate_and_never_stops_a_server_without_tls() {
    // Without any certificate, SIGHUP is heard (and logged) and the server serves on.
    let mut plain = Sluice::builder().start().await.unwrap();
    plain.signal(nix::sys::signal::Signal::SIGHUP).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !plain
        .stderr()
        .contains("SIGHUP: reloading TLS certificates")
    {
        assert!(Instant::now() < deadline, "{}", plain.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, _) = get_json(&format!("{}/version", plain.admin_url)).await;
    assert_eq!(status, 200, "the server still serves after SIGHUP");
    let health = reqwest::get(format!("{}/service/health", plain.ingress_url))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);

    // The admin listener's certificate is read again on SIGHUP, like the ingress's.
    let dir = tempfile::tempdir().unwrap();
    let first = certificate(dir.path(), "first");
    let second = certificate(dir.path(), "second");
    install(dir.path(), "first");
    let mut sluice = Sluice::builder()
        .admin_tls(
            &dir.path().join("server.crt"),
            &dir.path().join("server.key"),
        )
        .start()
        .await
        .unwrap();
    let port: u16 = sluice
        .admin_url
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while Conn::open(port, &first, false).await.is_none() {
        assert!(Instant::now() < deadline, "the TLS admin never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Renamed into place: the file watch would find it too, so the signal is checked by the
    // log line that names it.
    install(dir.path(), "second");
    sluice.signal(nix::sys::signal::Signal::SIGHUP).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while Conn::open(port, &second, false).await.is_none() {
        assert!(
            Instant::now() < deadline,
            "the second admin certificate never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        Conn::open(port, &first, false).await.is_none(),
        "the first certificate is no longer served"
    );
    assert!(
        sluice
            .stderr()
            .lines()
            .any(|l| l.contains("TLS certificate reloaded") && l.contains("admin")),
        "{}",
        sluice.stderr()
    );
    sluice.signal(nix::sys::signal::Signal::SIGTERM).unwrap();
    sluice.wait_exit(Duration::from_secs(10)).unwrap();
}
