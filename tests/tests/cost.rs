//! What a handler reports it spent (`ctx.run` steps named `sluice:cost`, issue 55's first step):
//! stored with the invocation's completion, in the same write, so a crash neither loses a charge
//! nor counts one twice.

use std::time::{Duration, Instant};

use serde_json::json;
use sluice_tests::{Sluice, TestDeployment, reported_cost_is_stored, sluice_for};

#[tokio::test]
async fn a_rust_handlers_reported_cost_is_stored_with_its_completion() {
    let dep = TestDeployment::start("v1").await.unwrap();
    let sluice = sluice_for(&dep, json!([])).await;
    reported_cost_is_stored(&sluice, "Meter").await;
}

#[tokio::test]
async fn charges_survive_kill_9_midway_and_each_counts_once() {
    const SENDS: u64 = 60;
    let dep = TestDeployment::start("v1").await.unwrap();
    let mut sluice = sluice_for(&dep, json!([])).await;

    // Each send reports half its amount, sleeps durably, then reports the rest: a kill finds
    // some before their first report, some between the two and some done.
    for amount in 1..=SENDS {
        let id = sluice
            .send("/service/send/Meter/spend", &(amount * 1000))
            .await;
        assert!(id.starts_with("inv_"), "{id}");
    }
    sluice.kill_9();
    let sluice = sluice.restart(Sluice::builder()).await;

    let done = "SELECT count(*) AS n FROM sys_invocation WHERE target_handler_name = 'spend' AND status = 'completed'";
    let deadline = Instant::now() + Duration::from_secs(30);
    while sluice.count(done).await < SENDS {
        assert!(Instant::now() < deadline, "the sends never all completed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let charged = sluice
        .count("SELECT sum(cost) AS n FROM sys_invocation WHERE target_handler_name = 'spend'")
        .await;
    assert_eq!(charged, (1..=SENDS).map(|a| a * 1000).sum::<u64>());
}
