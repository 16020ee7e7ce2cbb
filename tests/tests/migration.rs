//! Stores written by earlier releases start under today's binary, each fixture made by the
//! `make.sh` beside it with that release's binaries: a store written before flow control was
//! always on (`tests/fixtures/store-1.0`) gains its flow-control state, and one written before
//! rows were keyed by partition (`tests/fixtures/store-2.0`) is converted; in both everything
//! they held runs on — a sleeping object call, an invocation suspended on an awakeable, a
//! workflow waiting on its promise, a delayed send, object state and retained idempotent
//! results.

use std::path::Path;

use serde_json::Value;
use sluice_tests::{Sluice, TestDeployment, clock_offset_to};

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

async fn post(sluice: &Sluice, path: &str, body: &str) -> (u16, String) {
    let mut request = reqwest::Client::new().post(format!("{}{path}", sluice.ingress_url));
    if !body.is_empty() {
        request = request
            .header("content-type", "application/json")
            .body(body.to_owned());
    }
    let resp = request.send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

/// A fixture's store under today's binary: its ids, the clock offset the server runs with, the
/// server, and a deployment of today's at a new address.
struct FromFixture {
    ids: Value,
    offset: i64,
    sluice: Sluice,
    dep: TestDeployment,
    _scratch: tempfile::TempDir,
}

/// Starts today's binary on a copy of `tests/fixtures/<name>/data`, its clock an hour after
/// the fixture was written, whatever the day: the fixture's timers are due, its idempotent
/// results (kept 24 h) still retained. What was due while the store lay still runs at once;
/// until the deployment is pointed at its new address ([`point_at_todays`]) those attempts
/// fail, so retries come quickly.
async fn start_from(name: &str) -> FromFixture {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name);
    let ids: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("ids.json")).unwrap()).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let data = scratch.path().join("data");
    copy_dir(&fixture.join("data"), &data);
    let written_at = ids["written_at_ms"]
        .as_i64()
        .expect("ids.json has written_at_ms");
    let offset = clock_offset_to(written_at + 3_600_000);
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder()
        .data_dir(&data)
        .clock_offset_ms(offset)
        .quick_retries()
        .start()
        .await
        .unwrap();
    FromFixture {
        ids,
        offset,
        sluice,
        dep,
        _scratch: scratch,
    }
}

/// The fixture's deployment listened on a port that is gone: points it at today's.
async fn point_at_todays(sluice: &Sluice, dep: &TestDeployment) {
    let (_, listed) = sluice_tests::get_json(&format!("{}/deployments", sluice.admin_url)).await;
    let deployment = listed["deployments"][0]["id"].as_str().unwrap().to_owned();
    let resp = sluice
        .admin(
            reqwest::Method::PATCH,
            &format!("/deployments/{deployment}"),
        )
        .json(&serde_json::json!({ "uri": dep.uri }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
}

fn completed(v: &Value) -> bool {
    v["status"] == "completed"
}

/// The fixture's delayed send and sleeping object call, due long ago, complete.
async fn what_was_due_completes(sluice: &Sluice, ids: &Value) {
    for (name, what) in [
        ("delayed", "the delayed send completed"),
        ("sleeping", "the sleeping call completed"),
    ] {
        let id = ids[name].as_str().unwrap();
        sluice.invocation_until(id, what, completed).await;
    }
}

/// The fixture's awakeable and workflow promise are completed from outside, as before: the
/// awakeable's waiter answers `value`, the workflow its signup.
async fn the_awakeable_and_the_workflow_complete(sluice: &Sluice, ids: &Value, value: &str) {
    let awakeable = ids["awakeable"].as_str().unwrap();
    let (status, body) = post(
        sluice,
        &format!("/restate/awakeables/{awakeable}/resolve"),
        value,
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let awaiting = ids["awaiting"].as_str().unwrap();
    sluice
        .invocation_until(awaiting, "the awakeable's waiter completed", completed)
        .await;
    let (status, output) = reqwest::get(format!(
        "{}/restate/invocation/{awaiting}/output",
        sluice.ingress_url
    ))
    .await
    .map(|r| (r.status().as_u16(), r))
    .unwrap();
    assert_eq!(status, 200);
    assert_eq!(output.text().await.unwrap(), value);

    let (status, body) = post(sluice, "/Signup/fixture-user/approve", "\"approved\"").await;
    assert_eq!(status, 200, "{body}");
    let attached = reqwest::get(format!(
        "{}/restate/workflow/Signup/fixture-user/attach",
        sluice.ingress_url
    ))
    .await
    .unwrap();
    assert_eq!(attached.status(), 200);
    assert_eq!(
        attached.text().await.unwrap(),
        "\"signed up ada@example.com: approved\""
    );
}

/// The retained idempotent result of `key` answers `answer` again without running.
async fn retained(sluice: &Sluice, key: &str, answer: &str) {
    let resp = reqwest::Client::new()
        .post(format!("{}/Greeter/greet", sluice.ingress_url))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body("\"someone else\"")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), answer);
}

/// Stops `sluice` with SIGTERM and starts it again on its store, its clock moved by `offset`.
async fn restarted(mut sluice: Sluice, offset: i64) -> Sluice {
    sluice.signal(nix::sys::signal::Signal::SIGTERM).unwrap();
    sluice
        .wait_exit(std::time::Duration::from_secs(10))
        .unwrap();
    sluice
        .restart(Sluice::builder().clock_offset_ms(offset))
        .await
}

#[tokio::test]
async fn a_store_written_without_flow_control_migrates_and_keeps_its_work() {
    let FromFixture {
        ids,
        offset,
        sluice,
        dep,
        _scratch,
    } = start_from("store-1.0").await;
    let stderr = sluice.stderr();
    let migrated: Vec<_> = stderr
        .lines()
        .filter(|l| l.contains("the store gained flow-control state"))
        .collect();
    assert_eq!(migrated.len(), 1, "{stderr}");
    assert!(migrated[0].contains("in_flight=4"), "{stderr}");
    point_at_todays(&sluice, &dep).await;

    what_was_due_completes(&sluice, &ids).await;
    // Object state from before, plus the sleeping call's 10.
    assert_eq!(
        post(&sluice, "/Counter/acme/get", "").await,
        (200, "5".into())
    );
    assert_eq!(
        post(&sluice, "/Counter/beta/get", "").await,
        (200, "10".into())
    );
    the_awakeable_and_the_workflow_complete(&sluice, &ids, "\"after the migration\"").await;
    retained(&sluice, "fixture-1", "\"Hello, Ada!\"").await;

    // Flow control is on: a scoped call is admitted under the rule book.
    let (status, body) = post(
        &sluice,
        "/service/scope/tenant-a/call/Greeter/greet",
        "\"Bo\"",
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "\"Hello, Bo!\""));

    // A second start finds the store migrated and says nothing more.
    let again = restarted(sluice, offset).await;
    assert!(
        !again
            .stderr()
            .contains("the store gained flow-control state"),
        "{}",
        again.stderr()
    );
}

/// A store the release before partition-first keys wrote (`tests/fixtures/store-2.0`, format
/// 1, flow control on, work in flight over several partitions) is converted when it opens: its
/// rows move under their partitions, its invocations are indexed by scope and key, and
/// everything it held runs on.
#[tokio::test]
async fn a_store_written_before_rows_were_keyed_by_partition_converts_and_keeps_its_work() {
    let moved = converts_and_keeps_its_work("store-2.0", 1).await;
    assert!(moved > 20, "{moved} rows moved");
}

/// A store the release before the index by scope and key wrote (`tests/fixtures/store-3.0`,
/// format 2, rows keyed by partition) builds the index when it opens, moves no row, and runs
/// everything it held on.
#[tokio::test]
async fn a_store_written_before_invocations_were_indexed_by_key_converts_and_keeps_its_work() {
    let moved = converts_and_keeps_its_work("store-3.0", 2).await;
    assert_eq!(moved, 0, "its rows were keyed by partition already");
}

/// Starts from `fixture` (a store of format `from`, with the work `make.sh` leaves in flight),
/// checks that it was converted once and that all it held runs on and reads back, through the
/// index by scope and key too; answers how many rows the conversion moved.
async fn converts_and_keeps_its_work(fixture: &str, from: u32) -> u64 {
    let FromFixture {
        ids,
        offset,
        sluice,
        dep,
        _scratch,
    } = start_from(fixture).await;
    let stderr = sluice.stderr();
    let converted: Vec<_> = stderr
        .lines()
        .filter(|l| {
            l.contains(&format!(
                "the store was converted (store format {from} to 3)"
            ))
        })
        .collect();
    assert_eq!(converted.len(), 1, "{stderr}");
    let field = |name: &str| -> u64 {
        converted[0]
            .split(&format!("{name}="))
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("the conversion says {name}: {stderr}"))
    };
    let (moved, indexed) = (field("rows"), field("indexed"));
    assert_eq!(indexed, 1, "the one scoped call is indexed: {stderr}");
    // Straight to the node's count: nothing moves a second time.
    assert!(converted[0].contains("partitions=8"), "{stderr}");
    assert!(
        !stderr.contains("the store's rows were keyed by a new partition count"),
        "{stderr}"
    );
    point_at_todays(&sluice, &dep).await;

    what_was_due_completes(&sluice, &ids).await;
    // Every object's state, on whichever partition it lives; beta also got the sleeping
    // call's 10.
    for key in ["acme", "gamma", "delta", "epsilon", "zeta", "eta", "theta"] {
        assert_eq!(
            post(&sluice, &format!("/Counter/{key}/get"), "").await,
            (200, "5".into()),
            "{key}"
        );
    }
    assert_eq!(
        post(&sluice, "/Counter/beta/get", "").await,
        (200, "15".into())
    );
    the_awakeable_and_the_workflow_complete(&sluice, &ids, "\"after the conversion\"").await;
    for n in 1..=8 {
        retained(
            &sluice,
            &format!("fixture-{n}"),
            &format!("\"Hello, Ada {n}!\""),
        )
        .await;
    }
    // Introspection reads the converted rows: the scoped call (through the index) and the
    // journals are there.
    for sql in [
        "SELECT count(*) AS n FROM sys_invocation WHERE scope = 'tenant-a'",
        "SELECT count(target) AS n FROM sys_invocation WHERE scope = 'tenant-a'",
    ] {
        let (status, rows) = sluice.query(sql).await;
        assert_eq!(status, 200, "{rows}");
        assert_eq!(rows["rows"][0]["n"], 1, "{sql}: {rows}");
    }

    // A second start finds the store converted and moves nothing.
    let again = restarted(sluice, offset).await;
    assert!(
        !again.stderr().contains("the store was converted"),
        "{}",
        again.stderr()
    );
    assert_eq!(
        post(&again, "/Counter/beta/get", "").await,
        (200, "15".into())
    );
    moved
}
