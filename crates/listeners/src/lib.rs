//! What both doors' listeners share: the certificate a TLS listener serves
//! ([`certificates`], reloaded on SIGHUP or when its files change) and the bound on connections
//! from one IP address ([`per_ip`]). The ingress (pingora) and the admin API (axum) each take
//! them from here, so neither door depends on the other or on the binary.

pub mod certificates;
pub mod per_ip;
