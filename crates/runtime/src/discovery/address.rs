//! Which addresses a deployment may be registered on. Link-local and cloud metadata addresses
//! hand out credentials to whoever asks from the machine, so discovery never reaches them
//! unless the operator allows it explicitly; `public-only` also keeps private and loopback
//! networks out of reach.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use sluice_config::DeploymentAddressPolicy;
use sluice_core::errors::{Code, CodedError};

/// What kind of network an address is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    /// Reachable from anywhere.
    Public,
    /// Loopback or a private range (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7, ::1).
    Private,
    /// Link-local, cloud metadata or unspecified: never a deployment.
    Restricted,
}

/// The class of `ip` (IPv4-mapped IPv6 addresses count as their IPv4 address).
pub fn classify(ip: IpAddr) -> AddressClass {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => classify_v4(v4),
            None => classify_v6(v6),
        },
    }
}

fn classify_v4(ip: Ipv4Addr) -> AddressClass {
    let [a, b, ..] = ip.octets();
    // 100.100.100.200 is Alibaba Cloud's metadata service (inside 100.64/10).
    if ip.is_link_local()
        || ip.is_unspecified()
        || ip == Ipv4Addr::new(100, 100, 100, 200)
        || a == 0
    {
        AddressClass::Restricted
    } else if ip.is_loopback() || ip.is_private() || (a == 100 && (64..128).contains(&b)) {
        AddressClass::Private
    } else {
        AddressClass::Public
    }
}

fn classify_v6(ip: Ipv6Addr) -> AddressClass {
    let first = ip.segments()[0];
    // fd00:ec2::254 is AWS's IPv6 metadata service (inside fc00::/7).
    let metadata = ip == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);
    if metadata || ip.is_unspecified() || (first & 0xffc0) == 0xfe80 {
        AddressClass::Restricted
    } else if ip.is_loopback() || (first & 0xfe00) == 0xfc00 {
        AddressClass::Private
    } else {
        AddressClass::Public
    }
}

/// Whether `policy` lets a deployment be on `ip`.
pub fn allowed(policy: DeploymentAddressPolicy, ip: IpAddr) -> bool {
    matches!(
        (policy, classify(ip)),
        (DeploymentAddressPolicy::Any, _)
            | (_, AddressClass::Public)
            | (DeploymentAddressPolicy::AllowPrivate, AddressClass::Private)
    )
}

/// Resolves the host of `uri` and checks every address it names against `policy` (one refused
/// address refuses the URI: the connection could go to any of them).
pub async fn check(uri: &url::Url, policy: DeploymentAddressPolicy) -> Result<(), CodedError> {
    if policy == DeploymentAddressPolicy::Any {
        return Ok(());
    }
    let port = uri.port_or_known_default().unwrap_or(80);
    let addresses: Vec<IpAddr> = match uri.host() {
        Some(url::Host::Ipv4(ip)) => vec![IpAddr::V4(ip)],
        Some(url::Host::Ipv6(ip)) => vec![IpAddr::V6(ip)],
        Some(url::Host::Domain(name)) => match tokio::net::lookup_host((name, port)).await {
            Ok(found) => found.map(|a| a.ip()).collect(),
            // Unresolvable: discovery reports it as unreachable (META0003).
            Err(_) => return Ok(()),
        },
        None => return Ok(()),
    };
    match addresses.into_iter().find(|ip| !allowed(policy, *ip)) {
        None => Ok(()),
        Some(ip) => Err(CodedError::new(
            Code::SEC0005,
            format!(
                "'{uri}' resolves to {ip}, a {} address that admin.deployment-address-policy = \"{}\" does not allow",
                match classify(ip) {
                    AddressClass::Restricted => "link-local, metadata or unspecified",
                    AddressClass::Private => "private or loopback",
                    AddressClass::Public => "public",
                },
                match policy {
                    DeploymentAddressPolicy::AllowPrivate => "allow-private",
                    DeploymentAddressPolicy::PublicOnly => "public-only",
                    DeploymentAddressPolicy::Any => "any",
                }
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(text: &str) -> AddressClass {
        classify(text.parse().unwrap())
    }

    #[test]
    fn addresses_fall_in_their_class() {
        for restricted in [
            "169.254.169.254",
            "0.0.0.0",
            "fe80::1",
            "fd00:ec2::254",
            "::ffff:169.254.169.254",
            "100.100.100.200",
            "::",
        ] {
            assert_eq!(class(restricted), AddressClass::Restricted, "{restricted}");
        }
        for private in [
            "127.0.0.1",
            "10.0.0.1",
            "192.168.1.1",
            "172.16.0.1",
            "100.64.0.1",
            "::1",
            "fd12::1",
            "::ffff:127.0.0.1",
        ] {
            assert_eq!(class(private), AddressClass::Private, "{private}");
        }
        for public in ["8.8.8.8", "2001:4860::8888", "172.32.0.1"] {
            assert_eq!(class(public), AddressClass::Public, "{public}");
        }
    }

    #[tokio::test]
    async fn policies_decide() {
        let url = |s: &str| url::Url::parse(s).unwrap();
        let default = DeploymentAddressPolicy::default();
        assert!(check(&url("http://127.0.0.1:9080/"), default).await.is_ok());
        assert!(check(&url("http://localhost:9080/"), default).await.is_ok());
        let err = check(&url("http://169.254.169.254/latest"), default)
            .await
            .unwrap_err();
        assert_eq!(err.code, Some(Code::SEC0005));
        assert!(err.message.contains("link-local"), "{}", err.message);
        assert!(
            check(&url("http://[fd00:ec2::254]/"), default)
                .await
                .is_err()
        );
        let public = DeploymentAddressPolicy::PublicOnly;
        assert!(check(&url("http://127.0.0.1:9080/"), public).await.is_err());
        assert!(check(&url("http://localhost:9080/"), public).await.is_err());
        assert!(
            check(
                &url("http://169.254.169.254/"),
                DeploymentAddressPolicy::Any
            )
            .await
            .is_ok()
        );
    }
}
