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
    /// How many shards run the partitions (partition `p` on shard `p % shards`), once they
    /// run on shards (`crate::shards`).
    shards: std::sync::OnceLock<usize>,
    /// Told which partitions are led here whenever that changes (the deployment gates' share).
    on_led: std::sync::OnceLock<LedListener>,
    /// What the nodes of the cluster share (`cluster.secret`): proves a forwarded request.
    secret: Option<sluice_config::NodeSecret>,
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
            shards: std::sync::OnceLock::new(),
            on_led: std::sync::OnceLock::new(),
            secret: None,
        }
    }

    /// `n` partitions, none led here until the cluster says so; the nodes prove requests they
    /// forward to each other with `secret`.
    pub fn clustered(n: usize, secret: sluice_config::NodeSecret) -> Self {
        Self {
            clustered: true,
            here: (0..n).map(|_| AtomicBool::new(false)).collect(),
            leaders: RwLock::new(vec![None; n]),
            next: AtomicUsize::new(0),
            shards: std::sync::OnceLock::new(),
            on_led: std::sync::OnceLock::new(),
            secret: Some(secret),
        }
    }

    /// The secret the cluster's nodes share; `None` embedded.
    pub fn secret(&self) -> Option<&sluice_config::NodeSecret> {
        self.secret.as_ref()
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

    /// The partitions run on `shards` shards from now on (partition `p` on shard `p % shards`).
    pub fn run_on_shards(&self, shards: usize) {
        let _ = self.shards.set(shards.max(1));
    }

    /// A partition for a new invocation that may live on any: one led here (embedded: every
    /// one), and one of the calling shard's when it has one (its hand-over then wakes no other
    /// thread), in turn. `None`: anywhere, by its id (embedded off the shards), or this node
    /// leads none.
    pub fn pick_here(&self) -> Option<usize> {
        let shard = self
            .shards
            .get()
            .and_then(|&shards| crate::shards::current().map(|shard| (shard % shards, shards)));
        if !self.clustered && shard.is_none() {
            return None;
        }
        let led = |index: &usize| self.here[*index].load(Ordering::Acquire);
        let on_shard = |index: &usize| shard.is_none_or(|(shard, shards)| index % shards == shard);
        let only_mine = (0..self.here.len()).any(|i| led(&i) && on_shard(&i));
        let candidates =
            || (0..self.here.len()).filter(move |i| led(i) && (!only_mine || on_shard(i)));
        let count = candidates().count();
        if count == 0 {
            return None;
        }
        // A shard takes turns on its own counter: a shared one would bounce between cores on
        // every call.
        let turn = match shard {
            Some(_) => crate::shards::next_turn(count),
            None => self.next.fetch_add(1, Ordering::Relaxed) % count,
        };
        candidates().nth(turn)
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

    fn secret() -> sluice_config::NodeSecret {
        "the-nodes-own-secret".parse().unwrap()
    }

    #[test]
    fn embedded_runs_everything_here_and_clustered_follows_the_cluster() {
        let embedded = Placement::embedded(2);
        assert_eq!(embedded.route(1), Route::Here);
        let clustered = Placement::clustered(2, secret());
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
        let clustered = Placement::clustered(4, secret());
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
        let clustered = Placement::clustered(2, secret());
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
        let clustered = Placement::clustered(4, secret());
        assert_eq!(clustered.pick_here(), None);
        clustered.set_here(1, true);
        clustered.set_here(3, true);
        let picks: Vec<_> = (0..4).filter_map(|_| clustered.pick_here()).collect();
        assert_eq!(picks, [1, 3, 1, 3]);
        clustered.set_here(1, false);
        assert_eq!(clustered.pick_here(), Some(3));
    }

    #[test]
    fn new_work_on_a_shard_goes_to_that_shards_partitions_and_off_the_shards_anywhere() {
        let shards = crate::shards::Shards::start(2).expect("shards");
        let embedded = std::sync::Arc::new(Placement::embedded(5));
        embedded.run_on_shards(2);
        assert_eq!(
            embedded.pick_here(),
            None,
            "off the shards, an id spreads it"
        );
        let clustered = std::sync::Arc::new(Placement::clustered(4, secret()));
        clustered.run_on_shards(2);
        clustered.set_here(0, true);
        clustered.set_here(3, true);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        for shard in 0..2 {
            let (embedded, clustered) = (embedded.clone(), clustered.clone());
            let (mut picked, led) = runtime
                .block_on(shards.handle(shard).spawn(async move {
                    let picked: Vec<_> = (0..6).filter_map(|_| embedded.pick_here()).collect();
                    let led: Vec<_> = (0..2).filter_map(|_| clustered.pick_here()).collect();
                    (picked, led)
                }))
                .expect("ran");
            assert!(picked.iter().all(|p| p % 2 == shard), "{picked:?}");
            picked.sort_unstable();
            picked.dedup();
            let expected: Vec<usize> = (0..5).filter(|p| p % 2 == shard).collect();
            assert_eq!(picked, expected, "the shard's partitions take turns");
            // Cluster mode: the led partition of the shard; shard 1 leads 3 of its own.
            assert_eq!(led, [[0, 0], [3, 3]][shard]);
        }
        clustered.set_here(3, false);
        let led = runtime
            .block_on(shards.handle(1).spawn(async move { clustered.pick_here() }))
            .expect("ran");
        assert_eq!(
            led,
            Some(0),
            "no partition of its own led here: any led here"
        );
    }
}
