//! The Kotlin SDK through Sluice (`tests/kotlin-deployment`, Maven Central's
//! `dev.restate:sdk-kotlin-http` 2.4.0 behind Vert.x on loopback, protocol V6): registration,
//! and scoped calls made through the project's Java library (`sdks/java/sluice-scope`'s
//! `Scoped`, the headers Sluice reads on V6 commands), held by the rule book, with the handler
//! reading its own scope.

use serde_json::json;
use sluice_tests::{TestDeployment, sluice_for, v6_handlers_make_scoped_calls_by_headers};

#[tokio::test]
async fn kotlin_handlers_make_scoped_calls_through_the_library_and_read_their_own_scope() {
    let dep = TestDeployment::kotlin().await.unwrap();
    let sluice = sluice_for(
        &dep,
        json!([{"pattern": "kt", "limits": {"concurrency": 2}}]),
    )
    .await;
    let (status, deployments) = sluice.get_admin("/deployments").await;
    assert_eq!(status, 200, "{deployments}");
    let deployment = &deployments["deployments"][0];
    assert_eq!(deployment["max_protocol_version"], 6, "{deployments}");
    v6_handlers_make_scoped_calls_by_headers(&sluice, "KotlinMeter", "kt", json!(0)).await;
}
