//! Every way start-up can fail: one line on stderr with its code, a non-zero exit, no panic.

use std::net::TcpListener;

use redb::{Database, TableDefinition};
use sluice_tests::{Sluice, assert_startup_error};

#[test]
fn unknown_key_in_the_file_is_rt0002_with_path_and_line_exit_2() {
    let done = Sluice::builder()
        .config("log-level = \"info\"\n\n[worker.invoker]\nabort-timeout = \"1m\"\nabort-timout = \"2m\"\n")
        .run_to_exit()
        .unwrap();
    assert_startup_error(&done, "RT0002");
    assert_eq!(done.status.code(), Some(2));
    assert!(done.stderr.contains("line 5"), "{}", done.stderr);
    assert!(
        done.stderr.contains("`worker.invoker.abort-timout`"),
        "{}",
        done.stderr
    );
    assert!(
        done.stderr.contains("unknown field `abort-timout`"),
        "{}",
        done.stderr
    );
}

#[test]
fn bad_value_in_the_file_is_rt0002_with_path_and_line() {
    let done = Sluice::builder()
        .config("[ingress]\nthreads = 2\n\n[admin]\nbind = \"not an address\"\n")
        .run_to_exit()
        .unwrap();
    assert_startup_error(&done, "RT0002");
    assert_eq!(done.status.code(), Some(2));
    assert!(done.stderr.contains("line 5"), "{}", done.stderr);
    assert!(done.stderr.contains("`admin.bind`"), "{}", done.stderr);
}

#[test]
fn bad_env_value_is_rt0002_naming_the_variable() {
    let done = Sluice::builder()
        .env("SERVICE_EXPERIMENTAL_ENABLE_PROTOCOL_V7", "yes please")
        .run_to_exit()
        .unwrap();
    assert_startup_error(&done, "RT0002");
    assert_eq!(done.status.code(), Some(2));
    assert!(
        done.stderr
            .contains("environment variable SERVICE_EXPERIMENTAL_ENABLE_PROTOCOL_V7"),
        "{}",
        done.stderr
    );
}

#[test]
fn bad_advertised_endpoint_is_rt0002() {
    let done = Sluice::builder()
        .env("SERVICE_INGRESS__ADVERTISED_ENDPOINT", "tcp://somewhere:1")
        .run_to_exit()
        .unwrap();
    assert_startup_error(&done, "RT0002");
    assert!(
        done.stderr
            .contains("invalid advertised endpoint 'tcp://somewhere:1'"),
        "{}",
        done.stderr
    );
}

#[test]
fn what_this_build_cannot_honour_is_refused_at_start() {
    // Spans over https would be exported nowhere, silently.
    let done = Sluice::builder()
        .env(
            "SERVICE_TRACING__ENDPOINT",
            "https://collector.example:4318",
        )
        .run_to_exit()
        .unwrap();
    assert_startup_error(&done, "RT0002");
    assert!(done.stderr.contains("tracing.endpoint"), "{}", done.stderr);
    // Kafka over TLS would fail only in the consumer.
    let done = Sluice::builder()
        .config(
            "[[ingress.kafka-clusters]]\nname = \"k\"\nbrokers = [\"127.0.0.1:9\"]\nproperties = { \"security.protocol\" = \"SSL\" }\n",
        )
        .run_to_exit()
        .unwrap();
    assert_startup_error(&done, "RT0002");
    assert!(done.stderr.contains("no TLS for Kafka"), "{}", done.stderr);
}

#[test]
fn bad_log_format_flag_is_rt0002() {
    let done = Sluice::builder()
        .arg("--log-format")
        .arg("xml")
        .run_to_exit()
        .unwrap();
    assert_startup_error(&done, "RT0002");
    assert!(done.stderr.contains("flag --log-format"), "{}", done.stderr);
}

#[test]
fn busy_ingress_port_is_rt0004_naming_the_address() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    assert_ingress_port_refused(taken.local_addr().unwrap().port());
}

/// A Sluice started on ingress port `port` exits with RT0004 naming that listener.
fn assert_ingress_port_refused(port: u16) {
    let done = Sluice::builder().ingress_port(port).run_to_exit().unwrap();
    assert_startup_error(&done, "RT0004");
    assert!(
        done.stderr
            .contains(&format!("ingress listener on 127.0.0.1:{port}")),
        "{}",
        done.stderr
    );
}

#[test]
fn busy_admin_port_is_rt0004_naming_the_address() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let done = Sluice::builder().admin_port(port).run_to_exit().unwrap();
    assert_startup_error(&done, "RT0004");
    assert!(
        done.stderr
            .contains(&format!("admin listener on 127.0.0.1:{port}")),
        "{}",
        done.stderr
    );
}

#[tokio::test]
async fn a_second_sluice_on_a_serving_ones_ingress_port_is_rt0004_not_a_sharer_of_it() {
    // The shards' listeners share the port among themselves (SO_REUSEPORT); another process
    // must not join them.
    let first = Sluice::builder().start().await.unwrap();
    let port: u16 = first
        .ingress_url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap();
    assert_ingress_port_refused(port);
    let health = reqwest::get(format!("{}/health", first.admin_url))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test]
async fn second_instance_on_the_same_data_dir_is_rt0005() {
    let first = Sluice::builder().start().await.unwrap();
    let done = Sluice::builder()
        .data_dir(&first.data_dir)
        .run_to_exit()
        .unwrap();
    assert_startup_error(&done, "RT0005");
    assert!(
        done.stderr.contains("locked by another process"),
        "{}",
        done.stderr
    );
    // The first one is unharmed.
    let health = reqwest::get(format!("{}/health", first.admin_url))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}

#[test]
fn store_with_data_but_no_version_is_rt0009() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = Database::create(dir.path().join("sluice.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        let table: TableDefinition<u64, u64> = TableDefinition::new("someone_elses");
        txn.open_table(table).unwrap().insert(1, 1).unwrap();
        txn.commit().unwrap();
    }
    let done = Sluice::builder()
        .data_dir(dir.path())
        .run_to_exit()
        .unwrap();
    assert_startup_error(&done, "RT0009");
    assert!(done.stderr.contains("META0011"), "{}", done.stderr);
}

#[test]
fn store_from_a_newer_format_is_meta0010() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = Database::create(dir.path().join("sluice.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        let meta: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
        txn.open_table(meta)
            .unwrap()
            .insert("format_version", 1000u32.to_be_bytes().as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    let done = Sluice::builder()
        .data_dir(dir.path())
        .run_to_exit()
        .unwrap();
    assert_startup_error(&done, "META0010");
    assert!(
        done.stderr.contains("format version 1000"),
        "{}",
        done.stderr
    );
}

#[test]
fn data_dir_that_is_a_file_fails_clearly() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let done = Sluice::builder()
        .data_dir(file.path())
        .run_to_exit()
        .unwrap();
    assert!(!done.status.success());
    assert!(
        done.stderr.contains("cannot create data dir"),
        "{}",
        done.stderr
    );
    assert!(!done.stderr.contains("panicked"), "{}", done.stderr);
}
