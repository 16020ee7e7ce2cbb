//! What the seeded simulators share (tests only): a generator that gives the same sequence on
//! every machine, and the seed a run starts from (`SLUICE_SIM_SEED`, else the clock).

/// SplitMix64: tiny and deterministic, so a seed replays the same run everywhere.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// An index into something `len` long.
    pub fn index(&mut self, len: usize) -> usize {
        usize::try_from(self.below(len as u64)).expect("below a usize")
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// `SLUICE_SIM_SEED` when set, else one from the clock; a run prints it so it can be replayed.
pub fn seed() -> u64 {
    std::env::var("SLUICE_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        })
}

/// How many events a simulator runs: `SLUICE_SIM_EVENTS` when set, else `default`. A value that
/// is not a positive number stops the test instead of running nothing.
pub fn events(default: u64) -> u64 {
    match std::env::var("SLUICE_SIM_EVENTS") {
        Err(_) => default,
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(n) if n > 0 => n,
            _ => panic!("SLUICE_SIM_EVENTS={text:?}: write a positive number of events"),
        },
    }
}
