//! Where each partition runs. Embedded, every partition runs here. In cluster mode
//! (`docs/cluster.md`) the cluster keeps this up to date: which partitions this node leads,
//! and the ingress and admin URLs of the node leading each of the others, so a request for one
//! is forwarded there.

use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Where a partition runs, as this node knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Here.
    Here,
    /// On the node with this ingress and admin URL.
    Elsewhere {
        /// Its ingress URL.
        ingress: String,
        /// Its admin URL.
        admin: String,
    },
    /// Nobody leads it yet (a takeover is under way).
    Nobody,
}

/// Each partition's route. Embedded placement answers [`Route::Here`] for all.
pub struct Placement {
    clustered: bool,
    here: Vec<AtomicBool>,
    leaders: RwLock<Vec<Option<(String, String)>>>,
    /// Turns over the partitions led here for new invocations that may live on any.
    next: AtomicUsize,
    /// Told which partitions are led here whenever that changes (the deployment gates' share).
    on_led: std::sync::OnceLock<LedListener>,
}

/// Told which partitions this node leads (`true` at their index).
pub type LedListener = Box<dyn Fn(Vec<bool>) + Send + Sync>;

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placement")
            .field("clustered", &self.clustered)
            .field("led", &self.led())
            .finish_non_exhaustive()
    }
}

impl Placement {
    /// Every one of `n` partitions runs here.
    pub fn embedded(n: usize) -> Self {
        Self {
            clustered: false,
            here: (0..n).map(|_| AtomicBool::new(true)).collect(),
            leaders: RwLock::new(vec![None; n]),
            next: AtomicUsize::new(0),
            on_led: std::sync::OnceLock::new(),
        }
    }

    /// `n` partitions, none led here until the cluster says so.
    pub fn clustered(n: usize) -> Self {
        Self {
            clustered: true,
            here: (0..n).map(|_| AtomicBool::new(false)).collect(),
            leaders: RwLock::new(vec![None; n]),
            next: AtomicUsize::new(0),
            on_led: std::sync::OnceLock::new(),
        }
    }

    /// Whether this node is part of a cluster.
    pub fn is_clustered(&self) -> bool {
        self.clustered
    }

    /// Where partition `index` runs.
    pub fn route(&self, index: usize) -> Route {
        if self
            .here
            .get(index)
            .is_none_or(|here| here.load(Ordering::Acquire))
        {
            return Route::Here;
        }
        let leaders = self.leaders.read().unwrap_or_else(|e| e.into_inner());
        match leaders.get(index).cloned().flatten() {
            Some((ingress, admin)) => Route::Elsewhere { ingress, admin },
            None => Route::Nobody,
        }
    }

    /// Cluster mode: a partition led here for a new invocation that may live on any, the
    /// ones led here in turn (`None` embedded, where its id spreads it, or when this node
    /// leads none).
    pub fn pick_here(&self) -> Option<usize> {
        if !self.clustered {
            return None;
        }
        let led = self
            .here
            .iter()
            .filter(|here| here.load(Ordering::Acquire))
            .count();
        if led == 0 {
            return None;
        }
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % led;
        self.here
            .iter()
            .enumerate()
            .filter(|(_, here)| here.load(Ordering::Acquire))
            .nth(turn)
            .map(|(index, _)| index)
    }

    /// Whether partition `index` runs here.
    pub fn is_here(&self, index: usize) -> bool {
        self.here
            .get(index)
            .is_some_and(|here| here.load(Ordering::Acquire))
    }

    /// This node leads partition `index` (or stopped leading it).
    pub fn set_here(&self, index: usize, here: bool) {
        if let Some(flag) = self.here.get(index)
            && flag.swap(here, Ordering::AcqRel) != here
            && let Some(listener) = self.on_led.get()
        {
            listener(self.led());
        }
    }

    /// Which partitions this node leads.
    pub fn led(&self) -> Vec<bool> {
        self.here
            .iter()
            .map(|here| here.load(Ordering::Acquire))
            .collect()
    }

    /// Tells `listener` which partitions this node leads, now and whenever that changes.
    pub fn on_led(&self, listener: LedListener) {
        listener(self.led());
        let _ = self.on_led.set(listener);
    }

    /// This node, reached at `ingress`, stopped leading partition `index`. While no other
    /// node's epoch was read, nobody leads it (not this node: a call sent here would come
    /// back forwarded to itself).
    pub fn step_down(&self, index: usize, ingress: &str) {
        self.set_here(index, false);
        let mut leaders = self.leaders.write().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = leaders.get_mut(index)
            && slot.as_ref().is_some_and(|(led_by, _)| led_by == ingress)
        {
            *slot = None;
        }
    }

    /// The node at `ingress`/`admin` leads partition `index` (as its accepted epoch says).
    pub fn set_leader(&self, index: usize, ingress: String, admin: String) {
        let mut leaders = self.leaders.write().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = leaders.get_mut(index) {
            *slot = Some((ingress, admin));
        }
    }

    /// Cluster mode: the admin URLs of the other nodes leading partitions (each once), and how
    /// many partitions no node leads right now.
    pub fn leaders_elsewhere(&self) -> (Vec<String>, usize) {
        let leaders = self.leaders.read().unwrap_or_else(|e| e.into_inner());
        let mut admins = Vec::new();
        let mut nobody = 0;
        for (index, leader) in leaders.iter().enumerate() {
            if self.is_here(index) {
                continue;
            }
            match leader {
                Some((_, admin)) if !admins.contains(admin) => admins.push(admin.clone()),
                Some(_) => {}
                None => nobody += 1,
            }
        }
        (admins, nobody)
    }

    /// How many partitions there are.
    pub fn len(&self) -> usize {
        self.here.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.here.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_runs_everything_here_and_clustered_follows_the_cluster() {
        let embedded = Placement::embedded(2);
        assert_eq!(embedded.route(1), Route::Here);
        let clustered = Placement::clustered(2);
        assert_eq!(clustered.route(0), Route::Nobody);
        clustered.set_leader(0, "http://a/".into(), "http://a:9/".into());
        assert!(
            matches!(clustered.route(0), Route::Elsewhere { ref ingress, .. } if ingress == "http://a/")
        );
        clustered.set_here(0, true);
        assert_eq!(clustered.route(0), Route::Here);
    }

    #[test]
    fn the_other_leaders_are_named_once_and_unled_partitions_counted() {
        let clustered = Placement::clustered(4);
        clustered.set_leader(0, "http://a/".into(), "http://a:9/".into());
        clustered.set_leader(1, "http://a/".into(), "http://a:9/".into());
        clustered.set_leader(2, "http://me/".into(), "http://me:9/".into());
        clustered.set_here(2, true);
        assert_eq!(
            clustered.leaders_elsewhere(),
            (vec!["http://a:9/".to_owned()], 1)
        );
    }

    #[test]
    fn a_step_down_leaves_nobody_leading_unless_another_node_took_over() {
        let clustered = Placement::clustered(2);
        for p in 0..2 {
            clustered.set_leader(p, "http://me/".into(), "http://me:9/".into());
            clustered.set_here(p, true);
        }
        clustered.step_down(0, "http://me/");
        assert_eq!(clustered.route(0), Route::Nobody);
        // Another node's epoch was read before this node's leader ended.
        clustered.set_leader(1, "http://b/".into(), "http://b:9/".into());
        clustered.step_down(1, "http://me/");
        assert!(
            matches!(clustered.route(1), Route::Elsewhere { ref ingress, .. } if ingress == "http://b/")
        );
    }

    #[test]
    fn new_work_goes_to_the_partitions_led_here_in_turn() {
        assert_eq!(Placement::embedded(4).pick_here(), None);
        let clustered = Placement::clustered(4);
        assert_eq!(clustered.pick_here(), None);
        clustered.set_here(1, true);
        clustered.set_here(3, true);
        let picks: Vec<_> = (0..4).filter_map(|_| clustered.pick_here()).collect();
        assert_eq!(picks, [1, 3, 1, 3]);
        clustered.set_here(1, false);
        assert_eq!(clustered.pick_here(), Some(3));
    }
}
