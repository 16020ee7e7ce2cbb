//! Paced drains after an outage: an AIMD window on the attempts a deployment runs at once.
//!
//! A deployment that answers is not paced, whatever its handlers answer: a 500, 502 or 504,
//! or a connection that broke mid-attempt, is judged per invocation (its own retry back-off),
//! so one failing handler never holds back the deployment's healthy ones. Trouble starts
//! pacing: a 429/503 (the deployment says it is overloaded), or failures to connect to it two
//! in a row with no answer between them (one alone is noise: a dropped connection). After an outage the window
//! starts small, so the
//! backlog that waited through it is released with a slow start rather than all at once. The
//! window doubles per round of successes up to the last window that was too large (its
//! threshold), then grows by one per round; each new overload halves it, once per round (the
//! attempts already running when it was halved do not halve it again). Once it reaches
//! `open_window` the deployment is trusted again and pacing ends.
//!
//! Pure: the caller passes time and how many attempts run now, so it can be tested exhaustively.

/// What an attempt's end says about its deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// The deployment answered (whatever the handler decided).
    Answered,
    /// It answered 429 or 503: it is overloaded; `retry_after_ms` when it said when to come back.
    Overloaded {
        /// Its `Retry-After`, in ms.
        retry_after_ms: Option<u64>,
    },
    /// No connection to it could be made.
    Down,
    /// The attempt ended for a reason that says nothing about the deployment as a whole (a
    /// 500/502/504 or a broken stream from one handler, a timeout of the handler's own, a
    /// protocol violation, an abort).
    Neutral,
}

/// How pacing behaves (`worker.invoker.drain`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacingConfig {
    /// Pace at all; off, a deployment's failures never hold its other attempts back.
    pub enabled: bool,
    /// The window after an outage (and the smallest a halving leaves).
    pub initial_window: u32,
    /// The window at which pacing ends.
    pub open_window: u32,
    /// Longest `Retry-After` the gate honours for the whole deployment, in ms.
    pub max_closed_ms: u64,
    /// While it stays unreachable, a round of probes waits 100 ms, then twice as long each
    /// round, at most this long (ms): an outage costs a few attempts, not a retry storm.
    pub max_probe_ms: u64,
}

impl Default for PacingConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            initial_window: 2,
            open_window: 64,
            max_closed_ms: 60_000,
            max_probe_ms: 2_000,
        }
    }
}

/// The wait before the first round of probes of an unreachable deployment, in ms.
const FIRST_PROBE_MS: u64 = 100;

/// Failures to reach a deployment, with no answer between them, that make it down.
const DOWN_AFTER: u32 = 2;

/// The AIMD state of one deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pacer {
    config: PacingConfig,
    /// `None` while not paced.
    window: Option<u32>,
    /// Slow start below it, one per round above.
    threshold: u32,
    /// Successes counted towards the next +1 above the threshold.
    credit: u32,
    /// Outcomes still to come from attempts that ran beside the one that last shrank the
    /// window: they do not shrink it again.
    shrunk_for: u32,
    /// New attempts wait until then (a `Retry-After`, or the next probe), in ms.
    closed_until_ms: u64,
    /// The wait before the next round of probes while unreachable, in ms.
    probe_ms: u64,
    /// Failures to reach it since it last answered.
    downs: u32,
}

impl Pacer {
    /// Not paced.
    pub fn new(config: PacingConfig) -> Self {
        let config = PacingConfig {
            initial_window: config.initial_window.max(1),
            open_window: config.open_window.max(config.initial_window.max(1)),
            ..config
        };
        Self {
            config,
            window: None,
            threshold: config.open_window,
            credit: 0,
            shrunk_for: 0,
            closed_until_ms: 0,
            probe_ms: FIRST_PROBE_MS,
            downs: 0,
        }
    }

    /// The window in force; `None` when not paced.
    pub fn window(&self) -> Option<u32> {
        self.window
    }

    /// Until when new attempts wait, in ms (0: not closed).
    pub fn closed_until_ms(&self) -> u64 {
        self.closed_until_ms
    }

    /// Takes what an attempt's end says; `running` attempts (including this one) ran when it
    /// ended. Answers whether the window grew (waiters may fit now).
    pub fn observe(&mut self, signal: Signal, running: u32, now_ms: u64) -> bool {
        if !self.config.enabled {
            return false;
        }
        let first_of_round = self.shrunk_for == 0;
        self.shrunk_for = self.shrunk_for.saturating_sub(1);
        match signal {
            Signal::Neutral => false,
            Signal::Answered => {
                self.probe_ms = FIRST_PROBE_MS;
                self.downs = 0;
                self.grow()
            }
            Signal::Down => {
                // One failure between answers is noise (a bad path, a dropped connection):
                // the deployment is down when failures come with no answer between them.
                self.downs = self.downs.saturating_add(1);
                if self.downs < DOWN_AFTER {
                    return false;
                }
                // Unreachable: the next round of probes waits, longer each round.
                if first_of_round || self.window.is_none() {
                    self.close_for(now_ms, self.probe_ms.min(self.config.max_probe_ms));
                    self.probe_ms = self
                        .probe_ms
                        .saturating_mul(2)
                        .min(self.config.max_probe_ms);
                }
                // And it starts again from the smallest window, whatever ran.
                if self.window != Some(self.config.initial_window) {
                    let before = self.window.unwrap_or(self.config.open_window);
                    let threshold = (before / 2).max(self.config.initial_window);
                    self.shrink(self.config.initial_window, threshold, running);
                }
                false
            }
            Signal::Overloaded { retry_after_ms } => {
                if let Some(after) = retry_after_ms {
                    self.close_for(now_ms, after.min(self.config.max_closed_ms));
                }
                if first_of_round || self.window.is_none() {
                    // Halved from what ran (not paced yet) or from the window, once per round.
                    let from = self.window.unwrap_or(running.max(1));
                    let half = (from / 2)
                        .max(self.config.initial_window)
                        .min(self.config.open_window);
                    self.shrink(half, half, running);
                }
                false
            }
        }
    }

    /// Paces at `window`, slow start up to `threshold`; the outcomes of the other attempts
    /// that ran beside this one do not shrink it again.
    fn shrink(&mut self, window: u32, threshold: u32, running: u32) {
        self.threshold = threshold;
        self.window = Some(window);
        self.credit = 0;
        self.shrunk_for = running.saturating_sub(1);
    }

    /// New attempts wait `ms` from `now_ms` (or longer, if already closed longer).
    fn close_for(&mut self, now_ms: u64, ms: u64) {
        self.closed_until_ms = self.closed_until_ms.max(now_ms.saturating_add(ms));
    }

    /// One success: +1 below the threshold (doubling per round), +1 per round above it.
    fn grow(&mut self) -> bool {
        let Some(window) = self.window else {
            return false;
        };
        let grown = if window < self.threshold {
            window + 1
        } else {
            self.credit += 1;
            if self.credit < window {
                return false;
            }
            self.credit = 0;
            window + 1
        };
        if grown >= self.config.open_window {
            self.window = None;
            self.threshold = self.config.open_window;
        } else {
            self.window = Some(grown);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pacer() -> Pacer {
        Pacer::new(PacingConfig {
            enabled: true,
            initial_window: 2,
            open_window: 32,
            max_closed_ms: 10_000,
            max_probe_ms: 1_000,
        })
    }

    #[test]
    fn an_outage_starts_small_and_slow_starts_to_open() {
        let mut p = pacer();
        assert_eq!(p.window(), None, "healthy deployments are not paced");
        p.observe(Signal::Down, 40, 0);
        assert_eq!(p.window(), None, "one failure is noise");
        p.observe(Signal::Answered, 40, 0);
        p.observe(Signal::Down, 40, 0);
        assert_eq!(p.window(), None, "an answer came between");
        p.observe(Signal::Down, 40, 0);
        assert_eq!(p.window(), Some(2), "two in a row: down");
        // The 38 other attempts that ran fail too: still the smallest window.
        for _ in 0..38 {
            p.observe(Signal::Down, 39, 0);
        }
        assert_eq!(p.window(), Some(2));
        // Up again: +1 per success below the threshold (16, half of the open window).
        let mut successes = 0;
        while p.window().is_some_and(|w| w < 16) {
            assert!(p.observe(Signal::Answered, 2, 0));
            successes += 1;
        }
        assert_eq!(successes, 14);
        // Above it: +1 per round (a window's worth of successes).
        for _ in 0..15 {
            p.observe(Signal::Answered, 16, 0);
        }
        assert_eq!(p.window(), Some(16));
        p.observe(Signal::Answered, 16, 0);
        assert_eq!(p.window(), Some(17));
        let mut rounds = 0;
        while p.window().is_some() {
            p.observe(Signal::Answered, 20, 0);
            rounds += 1;
            assert!(rounds < 1_000);
        }
        assert_eq!(p.window(), None, "open again at 32");
    }

    #[test]
    fn overloads_halve_once_per_round_and_close_for_retry_after() {
        let mut p = pacer();
        p.observe(
            Signal::Overloaded {
                retry_after_ms: None,
            },
            24,
            0,
        );
        assert_eq!(p.window(), Some(12), "halved from what ran");
        // The other attempts that ran then answer 503 too: one halving for the round.
        for _ in 0..23 {
            p.observe(
                Signal::Overloaded {
                    retry_after_ms: None,
                },
                23,
                0,
            );
        }
        assert_eq!(p.window(), Some(12));
        p.observe(
            Signal::Overloaded {
                retry_after_ms: Some(5_000),
            },
            12,
            100,
        );
        assert_eq!(p.window(), Some(6));
        assert_eq!(p.closed_until_ms(), 5_100);
        p.observe(
            Signal::Overloaded {
                retry_after_ms: Some(u64::MAX),
            },
            12,
            200,
        );
        assert_eq!(p.closed_until_ms(), 10_200, "capped at max_closed_ms");
        // Halving never goes below the initial window.
        for _ in 0..100 {
            p.observe(
                Signal::Overloaded {
                    retry_after_ms: None,
                },
                1,
                0,
            );
        }
        assert_eq!(p.window(), Some(2));
    }

    #[test]
    fn disabled_pacing_never_paces() {
        let mut p = Pacer::new(PacingConfig {
            enabled: false,
            ..PacingConfig::default()
        });
        p.observe(Signal::Down, 10, 0);
        p.observe(Signal::Down, 10, 0);
        p.observe(
            Signal::Overloaded {
                retry_after_ms: Some(1_000),
            },
            10,
            0,
        );
        assert_eq!((p.window(), p.closed_until_ms()), (None, 0));
    }

    fn signal() -> impl Strategy<Value = Signal> {
        prop_oneof![
            4 => Just(Signal::Answered),
            1 => Just(Signal::Down),
            1 => Just(Signal::Neutral),
            1 => proptest::option::of(0..100_000u64)
                .prop_map(|retry_after_ms| Signal::Overloaded { retry_after_ms }),
        ]
    }

    proptest! {
        /// Whatever happens, the window stays within its bounds, only an overload or an outage
        /// shrinks it, and a run of successes always opens it again.
        #[test]
        fn the_window_stays_bounded_and_always_opens_again(
            initial in 1..8u32,
            open in 1..200u32,
            signals in proptest::collection::vec((signal(), 0..300u32), 0..400),
        ) {
            let mut p = Pacer::new(PacingConfig {
                enabled: true,
                initial_window: initial,
                open_window: open,
                max_closed_ms: 60_000,
                max_probe_ms: 2_000,
            });
            let open = open.max(initial);
            for (now, (signal, running)) in signals.into_iter().enumerate() {
                let before = p.window();
                let grew = p.observe(signal, running, now as u64);
                if let Some(w) = p.window() {
                    prop_assert!((initial..=open).contains(&w), "window {w}");
                }
                prop_assert!(p.closed_until_ms() <= now as u64 + 60_000);
                let shrank = match (before, p.window()) {
                    (None, Some(_)) => true,
                    (Some(b), Some(a)) => a < b,
                    _ => false,
                };
                if shrank {
                    let shrinks = matches!(signal, Signal::Down | Signal::Overloaded { .. });
                    prop_assert!(shrinks, "{:?} shrank the window", signal);
                }
                if grew {
                    prop_assert_eq!(signal, Signal::Answered);
                }
            }
            let mut successes = 0u64;
            while p.window().is_some() {
                p.observe(Signal::Answered, 1, 0);
                successes += 1;
                prop_assert!(successes <= u64::from(open) * u64::from(open) + 300);
            }
        }
    }
}
