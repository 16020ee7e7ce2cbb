//! The partition's data: what arrives (`events`), what a batch asks for once stored
//! (`effect`) and what callers are owed (`answer`), where an invocation stands (`phase`, with the
//! transition table), and the pure rules over protocol messages the commands apply — operator
//! control (`control`), signals and awakeables (`signals`), calls between handlers (`calls`),
//! restarting from a journal prefix (`restart`), what an invocation spent by its handler's own
//! report (`cost`). Nothing here imports the partition's state
//! or behaviour: the command handlers and the run loop import this, never the other way.

pub mod answer;
pub mod bulk;
pub mod calls;
pub mod cost;
pub mod effect;
pub mod events;
pub mod operator;
pub mod phase;
pub mod restart;
pub mod signals;
