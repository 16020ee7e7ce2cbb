//! Reads of the live flow state bounded at each partition: `?scope=` and `?limit=` on
//! `GET /limits/counters` and `GET /vqueues` (the busiest, with the total that matched), SQL's
//! `scope = '…'` and bare `LIMIT` on the flow tables, and the gauges summed without a snapshot
//! per counter.

use std::time::Duration;

use serde_json::{Value, json};
use sluice_tests::{Sluice, TestDeployment};

/// Holds scope `held` to one call at a time and sends it 4 calls under key `k1` and one under
/// each of `k2` … `k12`: 14 wait, under a scope counter and 12 key counters and queues.
async fn hold_fourteen(sluice: &Sluice) {
    let (status, body) = sluice
        .put_rules(json!([{"pattern": "held", "limits": {"concurrency": 1}}]))
        .await;
    assert_eq!(status, 200, "{body}");
    let keys = std::iter::repeat_n(1, 4).chain(2..=12);
    for key in keys {
        sluice
            .send(
                &format!("/service/scope/held/send/Meter/hold?limit-key=k{key}"),
                &600_000,
            )
            .await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let waiting = sluice
            .count("SELECT count(*) AS n FROM sys_invocation WHERE scope = 'held' AND status = 'pending'")
            .await;
        if waiting == 14 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{waiting} of 14 waiting"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `count(*)` of `read` (`FROM … [WHERE …]`), and how many rows a read of `columns` of it
/// lists: a count that reads no column must agree with the rows.
async fn counted_and_listed(sluice: &Sluice, read: &str, columns: &str) -> (u64, usize) {
    let counted = sluice.count(&format!("SELECT count(*) AS n {read}")).await;
    let (status, rows) = sluice.query(&format!("SELECT {columns} {read}")).await;
    assert_eq!(status, 200, "{read}: {rows}");
    (counted, rows["rows"].as_array().unwrap().len())
}

fn names(counters: &Value) -> Vec<(Option<&str>, u64)> {
    counters["counters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["l1"].as_str(), c["queued"].as_u64().unwrap()))
        .collect()
}

#[tokio::test]
async fn bounded_reads_pick_the_busiest_of_a_scope_and_say_how_many_matched() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = Sluice::builder().start().await.unwrap();
    sluice.register(&dep.uri, false).await;
    hold_fourteen(&sluice).await;
    sluice
        .send("/service/scope/other/send/Meter/hold?limit-key=x", &600_000)
        .await;

    // The counters route: the scope's two busiest (itself, and k1), of its 12.
    let (status, page) = sluice
        .get_admin("/limits/counters?scope=held&limit=2")
        .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(
        page["total"], 13,
        "the scope's counter and its 12 keys: {page}"
    );
    let shown = names(&page);
    assert_eq!(shown.len(), 2, "{page}");
    assert_eq!(shown[0], (None, 14), "{page}");
    assert_eq!(shown[1].0, Some("k1"), "{page}");
    assert!(shown[1].1 >= 3, "k1 holds 3 or 4 waiting: {page}");
    let (_, everything) = sluice.get_admin("/limits/counters").await;
    assert_eq!(
        everything["total"], 15,
        "both scopes, by default all of them: {everything}"
    );
    assert_eq!(everything["counters"].as_array().unwrap().len(), 15);
    for bad in ["limit=0", "limit=100001", "limit=many", "size=3"] {
        let (status, body) = sluice.get_admin(&format!("/limits/counters?{bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
        if bad.starts_with("limit=1") || bad == "limit=0" {
            assert_eq!(body["restate_code"], "ADM0002", "{bad}: {body}");
        }
    }

    // The queues route: one queue per key; the busiest is k1's.
    let (status, queues) = sluice.get_admin("/vqueues?scope=held&limit=1").await;
    assert_eq!(status, 200, "{queues}");
    assert_eq!(queues["total"], 12, "{queues}");
    let listed = queues["vqueues"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{queues}");
    assert_eq!(listed[0]["limit_key"], "k1", "{queues}");
    let (_, all) = sluice.get_admin("/vqueues").await;
    assert_eq!(
        all["total"], 12,
        "other's call runs: its queue is empty and gone: {all}"
    );

    // SQL: a scope's rows, and a bare LIMIT, whatever the reader leaves out.
    let n = sluice
        .count("SELECT count(*) AS n FROM sys_user_limits WHERE scope = 'held'")
        .await;
    assert_eq!(n, 13);
    let (status, rows) = sluice
        .query("SELECT scope, l1 FROM sys_user_limits LIMIT 3")
        .await;
    assert_eq!(status, 200, "{rows}");
    assert_eq!(rows["rows"].as_array().unwrap().len(), 3, "{rows}");
    let n = sluice
        .count("SELECT count(*) AS n FROM sys_vqueue_meta WHERE scope = 'held'")
        .await;
    assert_eq!(n, 12);
    let n = sluice
        .count("SELECT count(*) AS n FROM sys_scheduler WHERE scope = 'held' AND num_inbox > 1")
        .await;
    assert_eq!(n, 1, "k1's queue: the rest of the filter applied in full");

    // Counts that read no column are answered from the partitions' walks, no row built; they
    // agree with the rows a read of a column lists.
    for (table, scope, rows) in [
        ("sys_user_limits", "", 15),
        ("sys_scheduler", "WHERE scope = 'held'", 12),
        ("sys_vqueue_meta", "", 12),
        ("sys_vqueues", "", 14),
    ] {
        let read = format!("FROM {table} {scope}");
        assert_eq!(
            counted_and_listed(&sluice, &read, "partition_key").await,
            (rows, rows as usize),
            "{read}"
        );
    }
    let n = sluice
        .count("SELECT count(*) AS n FROM (SELECT scope FROM sys_user_limits LIMIT 4)")
        .await;
    assert_eq!(n, 4, "a count under a limit counts no more");

    // The invocations of one key: the store's reader keeps the scope and the key a query
    // names, and the rest of the filter still applies.
    for (filter, n) in [
        ("limit_key = 'k1'", 4),
        ("scope = 'held' AND limit_key = 'k1'", 4),
        ("scope = 'other' AND limit_key = 'k1'", 0),
        ("limit_key = 'k1' AND limit_key = 'k2'", 0),
        ("'x' = limit_key", 1),
        ("limit_key = 'k1' AND status = 'running'", 1),
        ("scope = 'held'", 15),
    ] {
        let read = format!("FROM sys_invocation WHERE {filter}");
        assert_eq!(
            counted_and_listed(&sluice, &read, "id, limit_key").await,
            (n, n as usize),
            "{read}"
        );
    }

    // The busiest few, sorted: read as such at the partition (crates/sql/src/busiest.rs).
    let (status, rows) = sluice
        .query("SELECT l1, num_queued FROM sys_user_limits WHERE scope = 'held' ORDER BY num_queued DESC LIMIT 2")
        .await;
    assert_eq!(status, 200, "{rows}");
    let rows = rows["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(
        (rows[0].get("l1"), &rows[0]["num_queued"]),
        (None, &json!(14)),
        "{rows:?}"
    );
    assert_eq!(rows[1]["l1"], "k1", "{rows:?}");
    let (status, rows) = sluice
        .query("SELECT id FROM sys_scheduler WHERE scope = 'held' ORDER BY num_inbox DESC LIMIT 1")
        .await;
    assert_eq!(status, 200, "{rows}");
    assert_eq!(rows["rows"][0]["id"], listed[0]["id"], "k1's queue: {rows}");
    let n = sluice
        .count("SELECT count(*) AS n FROM sys_user_limits WHERE scope = 'held' AND scope = 'other'")
        .await;
    assert_eq!(n, 0, "two scopes at once are no row");

    // The gauges, summed by rule and level without a snapshot per counter.
    let metrics = sluice.metrics().await;
    let held = |level: &str| {
        metrics
            .iter()
            .find(|(series, _)| {
                series.starts_with("sluice_flow_held{")
                    && series.contains("rule=\"held\"")
                    && series.contains(&format!("level=\"{level}\""))
            })
            .map(|(_, v)| *v)
    };
    assert_eq!(held("scope"), Some(14.0), "{metrics:?}");
}
