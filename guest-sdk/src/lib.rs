//! Write a Sluice policy plugin in a few lines of Rust.
//!
//! A plugin is a type implementing [`Policy`], exported with [`plugin!`] and built for
//! `wasm32-wasip2` as a `cdylib`. Override the hook the plugin is loaded for; the other keeps
//! its neutral default ([`Outcome::Keep`], [`Decision::Default`]).
//!
//! ```ignore
//! use sluice_guest::{Classification, Outcome, Policy, Request, plugin};
//!
//! struct TenantFromHeader;
//!
//! impl Policy for TenantFromHeader {
//!     fn extract(request: Request) -> Outcome {
//!         let header = sluice_guest::config("header").unwrap_or_else(|| "x-tenant".into());
//!         match sluice_guest::header(&request, &header) {
//!             Some(tenant) => Outcome::Set(Classification {
//!                 scope: Some(tenant.to_owned()),
//!                 limit_key: None,
//!             }),
//!             None => Outcome::Keep,
//!         }
//!     }
//! }
//!
//! plugin!(TenantFromHeader);
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2` and load the `.wasm` from
//! `target/wasm32-wasip2/release/` with `sluice plugins load <name> <file> --hook extract`.

#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "plugin",
        path: "../crates/plugins/wit",
        pub_export_macro: true,
        export_macro_name: "__export_plugin",
        default_bindings_module: "sluice_guest::bindings",
    });
}

pub use bindings::sluice::policy::host::LogLevel;
pub use bindings::sluice::policy::types::{
    Candidate, Classification, Counter, Decision, Level, Limit, Outcome, Rejection, Request, Target,
};

/// A policy plugin: override the hook it is loaded for.
pub trait Policy {
    /// Classifies an ingress request before Sluice validates it.
    fn extract(request: Request) -> Outcome {
        let _ = request;
        Outcome::Keep
    }

    /// Decides the limit of `counter`. `candidates` are the matching enabled rules, most
    /// specific first; `chosen` is the rule book's own pick.
    fn match_rule(
        counter: Counter,
        candidates: Vec<Candidate>,
        chosen: Option<Candidate>,
    ) -> Decision {
        let _ = (counter, candidates, chosen);
        Decision::Default
    }
}

/// A value of the configuration the plugin was loaded with.
pub fn config(key: &str) -> Option<String> {
    bindings::sluice::policy::host::config(key)
}

/// Writes `message` to Sluice's log, tagged with the plugin's name.
pub fn log(level: LogLevel, message: &str) {
    bindings::sluice::policy::host::log(level, message);
}

/// Wall-clock time in milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    bindings::sluice::policy::host::now_ms()
}

/// The first value of header `name` (any case) of `request`.
pub fn header<'a>(request: &'a Request, name: &str) -> Option<&'a str> {
    request
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// A rejection answered to the client with `status` and `message`.
pub fn reject(status: u16, message: impl Into<String>) -> Outcome {
    Outcome::Reject(Rejection {
        status,
        message: message.into(),
    })
}

/// Exports `$policy` (a type implementing [`Policy`]) as the plugin's component.
#[macro_export]
macro_rules! plugin {
    ($policy:ty) => {
        struct __SluicePlugin;

        impl $crate::bindings::Guest for __SluicePlugin {
            fn extract(request: $crate::Request) -> $crate::Outcome {
                <$policy as $crate::Policy>::extract(request)
            }

            fn match_rule(
                counter: $crate::Counter,
                candidates: ::std::vec::Vec<$crate::Candidate>,
                chosen: ::std::option::Option<$crate::Candidate>,
            ) -> $crate::Decision {
                <$policy as $crate::Policy>::match_rule(counter, candidates, chosen)
            }
        }

        $crate::bindings::__export_plugin!(__SluicePlugin with_types_in $crate::bindings);
    };
}
