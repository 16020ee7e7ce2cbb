//! Connections open at once per client address, on either listener: one client (or one
//! address behind which many hide) cannot take every place under the listener's global cap.
//! In a cluster, a client's connection to another node whose requests that node forwards here
//! takes a place too, under the client's address ([`Relayed`]), not the forwarding node's.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
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

/// A client's connection to another node of the cluster: that node's id and the client's
/// address and port as that node saw them.
pub type RelayedConnection = (String, SocketAddr);

/// The client connections whose requests other nodes forward here, each holding one place
/// under its client's address in the listener's [`PerIp`] for as long as any of its forwarded
/// requests is in flight: one client counts the same whether it connects here or through
/// another node, and a client behind a busy node cannot fill the places of every client of that
/// node. The map holds only connections with a request in flight.
#[derive(Debug)]
pub struct Relayed {
    per_ip: Arc<PerIp>,
    open: Mutex<HashMap<RelayedConnection, (Place, usize), foldhash::fast::RandomState>>,
}

/// One forwarded request's share of its client connection's place; the place is given back
/// when the connection's last request in flight ends.
#[derive(Debug)]
pub struct RelayedRequest {
    owner: Arc<Relayed>,
    connection: RelayedConnection,
}

impl Relayed {
    /// Counts relayed connections in `per_ip`, beside the listener's own connections.
    pub fn new(per_ip: Arc<PerIp>) -> Arc<Self> {
        Arc::new(Self {
            per_ip,
            open: Mutex::new(HashMap::default()),
        })
    }

    /// A forwarded request of `connection`: it shares the connection's place when one of its
    /// requests holds one already; else it takes a place under the client's address, or `None`
    /// when that address has every place taken.
    pub fn enter(self: &Arc<Self>, connection: RelayedConnection) -> Option<RelayedRequest> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, requests)) = open.get_mut(&connection) {
            *requests += 1;
        } else {
            let place = self.per_ip.enter(connection.1.ip())?;
            open.insert(connection.clone(), (place, 1));
        }
        Some(RelayedRequest {
            owner: Arc::clone(self),
            connection,
        })
    }

    /// The listener's per-address counts these connections take places in.
    pub fn per_ip(&self) -> &Arc<PerIp> {
        &self.per_ip
    }

    /// Relayed connections with a request in flight now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Drop for RelayedRequest {
    fn drop(&mut self) {
        let mut open = self.owner.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, requests)) = open.get_mut(&self.connection) {
            *requests = requests.saturating_sub(1);
            if *requests == 0 {
                // Gives the place back to the client's address.
                open.remove(&self.connection);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relayed_connection_holds_one_place_of_its_clients_address_while_it_has_requests() {
        let caps = PerIp::new(2);
        let relayed = Relayed::new(Arc::clone(&caps));
        let client: IpAddr = "127.0.0.2".parse().unwrap();
        let via_n2 = ("n2".to_owned(), SocketAddr::new(client, 4000));
        let via_n3 = ("n3".to_owned(), SocketAddr::new(client, 4000));
        let first = relayed.enter(via_n2.clone()).unwrap();
        let second = relayed
            .enter(via_n2.clone())
            .expect("a second stream of one connection");
        assert_eq!(caps.open(client), 1, "one connection, one place");
        let _direct = caps.enter(client).unwrap();
        assert!(
            relayed.enter(via_n3.clone()).is_none(),
            "the same address and port through another node is another connection, over the cap"
        );
        let _other = relayed
            .enter(("n2".to_owned(), "127.0.0.3:4000".parse().unwrap()))
            .expect("another client of the same node has its own places");
        drop(first);
        assert_eq!(caps.open(client), 2, "still a request in flight");
        drop(second);
        assert_eq!(caps.open(client), 1, "the connection's place came back");
        assert_eq!(relayed.len(), 1);
        assert!(relayed.enter(via_n3).is_some());
    }

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
