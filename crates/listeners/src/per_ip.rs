//! Connections open at once per client address, on either listener: one client (or one
//! address behind which many hide) cannot take every place under the listener's global cap.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Counts of open connections by client address, each bounded by `max`.
#[derive(Debug)]
pub struct PerIp {
    max: usize,
    open: Mutex<HashMap<IpAddr, usize, foldhash::fast::RandomState>>,
}

/// One connection's place under its address's cap; given back when dropped.
#[derive(Debug)]
pub struct Place {
    owner: Arc<PerIp>,
    ip: IpAddr,
}

impl PerIp {
    /// Caps every address at `max` connections (at least one).
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            open: Mutex::new(HashMap::default()),
        })
    }

    /// A place for a connection from `ip`, or `None` when that address has `max` open.
    pub fn enter(self: &Arc<Self>, ip: IpAddr) -> Option<Place> {
        // `::ffff:1.2.3.4` is the same client as `1.2.3.4`.
        let ip = ip.to_canonical();
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(ip).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(Place {
            owner: Arc::clone(self),
            ip,
        })
    }

    /// Connections open from `ip` now.
    #[cfg(test)]
    fn open(&self, ip: IpAddr) -> usize {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.get(&ip.to_canonical()).copied().unwrap_or(0)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut open = self.owner.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                // An address with nothing open keeps no entry: the map is bounded by the
                // connections open, not by every address ever seen.
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_address_is_capped_and_places_come_back() {
        let caps = PerIp::new(2);
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let first = caps.enter(a).unwrap();
        let _second = caps.enter(mapped).unwrap();
        assert!(caps.enter(a).is_none(), "a third from the same address");
        let _other = caps.enter(b).expect("another address has its own places");
        drop(first);
        assert_eq!(caps.open(a), 1);
        assert!(caps.enter(a).is_some());
    }

    #[test]
    fn an_address_with_nothing_open_leaves_no_entry() {
        let caps = PerIp::new(1);
        for i in 0..100u8 {
            drop(caps.enter(IpAddr::from([10, 0, 0, i])).unwrap());
        }
        assert!(caps.open.lock().unwrap().is_empty());
    }
}
