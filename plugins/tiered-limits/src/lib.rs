//! Premium scopes get a multiple of the limit their rule sets, or no limit at all.

use sluice_guest::{Candidate, Counter, Decision, Limit, Policy, config, plugin};

struct TieredLimits;

impl Policy for TieredLimits {
    fn match_rule(
        counter: Counter,
        _candidates: Vec<Candidate>,
        chosen: Option<Candidate>,
    ) -> Decision {
        let premium = config("premium").unwrap_or_default();
        if !premium
            .split(',')
            .map(str::trim)
            .any(|s| s == counter.scope)
        {
            return Decision::Default;
        }
        if config("unlimited").as_deref() == Some("true") {
            return Decision::Unlimited;
        }
        let multiplier = config("multiplier")
            .and_then(|m| m.parse::<u32>().ok())
            .unwrap_or(2);
        match chosen.map(|c| c.limit) {
            Some(Limit::Concurrency(n)) => Decision::Concurrency(n.saturating_mul(multiplier)),
            _ => Decision::Default,
        }
    }
}

plugin!(TieredLimits);
