//! `sluice deployments …` and `sluice services …` against a running server and a real SDK
//! deployment.

use std::process::{Command, Output};

use serde_json::Value;
use sluice_tests::{Sluice, TestDeployment, binary};

fn sluice(admin_url: &str, args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .env("SLUICE_ADMIN_URL", admin_url)
        .output()
        .expect("run sluice")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[tokio::test]
async fn register_list_describe_remove_from_the_cli() {
    let server = Sluice::builder().start().await.unwrap();
    let dep = TestDeployment::start("v1").await.unwrap();
    let admin = server.admin_url.clone();
    let uri = dep.uri.clone();

    let run = move |args: Vec<String>| {
        let admin = admin.clone();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            sluice(&admin, &args)
        })
    };
    let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();

    let out = run(args(&[
        "deployments",
        "register",
        &uri,
        "--header",
        "x-k=v",
    ]))
    .await
    .unwrap();
    let text = stdout(&out);
    assert!(text.starts_with("registered dp_1"), "{text}");
    assert!(
        text.contains("Counter") && text.contains("VirtualObject"),
        "{text}"
    );

    let out = run(args(&["deployments", "list", "--json"])).await.unwrap();
    let list: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let id = list["deployments"][0]["id"].as_str().unwrap().to_owned();

    let text = stdout(&run(args(&["deployments", "describe", &id])).await.unwrap());
    assert!(
        text.contains(&format!("id:        {id}")) && text.contains("BidiStream over HTTP/2.0"),
        "{text}"
    );

    let text = stdout(
        &run(args(&["services", "describe", "Counter"]))
            .await
            .unwrap(),
    );
    assert!(
        text.contains("add") && text.contains("Exclusive") && text.contains("Shared"),
        "{text}"
    );
    let text = stdout(&run(args(&["services", "list"])).await.unwrap());
    assert_eq!(text.lines().count(), 5, "header + 4 services:\n{text}");

    // Errors come back with their code, exit 1.
    let out = run(args(&["deployments", "register", "http://127.0.0.1:1/"]))
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.starts_with("error: [META0003]"), "{err}");
    let out = run(args(&[
        "deployments",
        "register",
        &uri,
        "--header",
        "novalue",
    ]))
    .await
    .unwrap();
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("write it as name=value")
    );

    let text = stdout(&run(args(&["deployments", "remove", &id])).await.unwrap());
    assert_eq!(text.trim(), format!("removed {id}"));
    let out = run(args(&["services", "describe", "Counter"]))
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("does not exist")
    );
}
