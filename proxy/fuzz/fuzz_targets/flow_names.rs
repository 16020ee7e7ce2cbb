//! Scope, limit-key and rule-pattern parsing never panic, and what parses prints back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_flow::{LimitKey, RulePattern, Scope};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(scope) = Scope::parse(text) {
        assert_eq!(scope.as_str(), text);
    }
    if let Ok(key) = LimitKey::parse(text) {
        assert_eq!(LimitKey::parse(key.as_str()).unwrap(), key);
        assert!(key.l1().len() <= 36);
    }
    if let Ok(pattern) = RulePattern::parse(text) {
        let printed = pattern.to_string();
        assert_eq!(RulePattern::parse(&printed).unwrap(), pattern);
        assert!(pattern.rank() <= 7);
    }
});
