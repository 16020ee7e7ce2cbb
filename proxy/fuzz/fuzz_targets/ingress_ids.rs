//! The ingress path grammar and every id parser never panic on hostile text, and a parsed id
//! prints back as the text it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_core::ids::{AwakeableId, DeploymentId, InvocationId, SubscriptionId};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for method in [http::Method::GET, http::Method::POST] {
        let _ = sluice_ingress::path::parse(&method, text);
    }
    if let Ok(id) = text.parse::<InvocationId>() {
        assert_eq!(id.to_string(), text);
    }
    if let Ok(id) = text.parse::<DeploymentId>() {
        assert_eq!(id.to_string(), text);
    }
    if let Ok(id) = text.parse::<SubscriptionId>() {
        assert_eq!(id.to_string(), text);
    }
    let _ = text.parse::<AwakeableId>();
});
