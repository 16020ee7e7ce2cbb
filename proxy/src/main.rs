use std::process::ExitCode;

use clap::Parser;

/// mimalloc instead of glibc's malloc: allocation and free were ~13 % of Sluice's CPU per call
/// under load (`docs/perf.md`, "The local log under embedded mode"), most of it glibc's
/// bin management (`_int_malloc`, `unlink_chunk`, `malloc_consolidate`) across threads.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    sluice::cli::run(sluice::cli::Cli::parse())
}
