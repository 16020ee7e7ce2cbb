//! A misbehaving plugin for Sluice's isolation tests: config `behaviour` picks how it fails.
//! Not an example to follow.

use std::hint::black_box;

use sluice_guest::{Classification, Outcome, Policy, Request, config, plugin};

struct Hostile;

impl Policy for Hostile {
    fn extract(request: Request) -> Outcome {
        match config("behaviour").as_deref() {
            Some("loop") => loop {
                black_box(&request);
            },
            Some("grow") => {
                let mut hoard = Vec::new();
                loop {
                    hoard.push(black_box(vec![1u8; 1 << 20]));
                }
            }
            Some("trap") => panic!("hostile plugin traps on purpose"),
            Some("bad-scope") => Outcome::Set(Classification {
                scope: Some("not a scope!".to_owned()),
                limit_key: None,
            }),
            _ => Outcome::Keep,
        }
    }
}

plugin!(Hostile);
