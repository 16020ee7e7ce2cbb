//! The partition's per-service metric handles, resolved once per thread and service rather
//! than on every call: resolving one hashes its name and labels, looks it up in the
//! recorder's registry and allocates its label. A shard is one thread, so its cache needs no
//! lock. Counters and histograms are never dropped from the registry (only gauges idle out,
//! `sluice-admin`'s `scrape.rs`), so a kept handle stays the one the registry exports. The
//! server installs its recorder before any partition runs, so no cache keeps a handle of no
//! recorder.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use metrics::{Counter, Histogram};
use sluice_core::metrics as names;

/// Most services one thread keeps handles for; past it the cache starts over (the registry
/// keeps the metrics, only the lookups are paid again).
const MOST_SERVICES: usize = 4096;

/// One service's handles.
pub(super) struct ServiceMetrics {
    pub created: Counter,
    pub attempts: Counter,
    pub attempt_duration: Histogram,
    pub invocation_duration: Histogram,
    pub succeeded: Counter,
    pub failed: Counter,
}

thread_local! {
    static SERVICES: RefCell<HashMap<String, Rc<ServiceMetrics>>> = RefCell::default();
}

/// The handles of `service` on this thread.
pub(super) fn of(service: &str) -> Rc<ServiceMetrics> {
    SERVICES.with(|services| {
        let mut services = services.borrow_mut();
        if let Some(found) = services.get(service) {
            return Rc::clone(found);
        }
        if services.len() >= MOST_SERVICES {
            services.clear();
        }
        let label = service.to_owned();
        let handles = Rc::new(ServiceMetrics {
            created: metrics::counter!(names::INVOCATIONS_CREATED, "service" => label.clone()),
            attempts: metrics::counter!(names::ATTEMPTS, "service" => label.clone()),
            attempt_duration: metrics::histogram!(names::ATTEMPT_DURATION, "service" => label.clone()),
            invocation_duration: metrics::histogram!(names::INVOCATION_DURATION, "service" => label.clone()),
            succeeded: metrics::counter!(names::INVOCATIONS_COMPLETED, "service" => label.clone(), "outcome" => "success"),
            failed: metrics::counter!(names::INVOCATIONS_COMPLETED, "service" => label.clone(), "outcome" => "failure"),
        });
        services.insert(label, Rc::clone(&handles));
        handles
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_resolves_its_handles_once_per_thread() {
        let first = of("Greeter");
        assert!(Rc::ptr_eq(&first, &of("Greeter")));
        assert!(!Rc::ptr_eq(&first, &of("Other")));
        // Another thread resolves its own.
        let elsewhere = std::thread::spawn(|| Rc::as_ptr(&of("Greeter")) as usize)
            .join()
            .unwrap();
        assert_ne!(elsewhere, Rc::as_ptr(&first) as usize);
    }
}
