//! What both doors' listeners share: the certificate a TLS listener serves
//! ([`certificates`], reloaded on SIGHUP or when its files change), the bound on connections
//! from one IP address ([`per_ip`]) and how long a client may take to read its answers
//! ([`writes`]). The ingress (pingora) and the admin API (axum) each take
//! them from here, so neither door depends on the other or on the binary.

pub mod certificates;
pub mod per_ip;
pub mod writes;
