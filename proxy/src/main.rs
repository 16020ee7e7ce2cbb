use std::process::ExitCode;

use clap::Parser;

/// mimalloc instead of glibc's malloc: allocation and free were ~13 % of Sluice's CPU per call
/// under load, most of it glibc's bin management (`_int_malloc`, `unlink_chunk`,
/// `malloc_consolidate`) across threads (`docs/perf.md`, "The answer after the sync alone, one
/// writer thread, mimalloc", with what it costs in resident memory).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    sluice::cli::run(sluice::cli::Cli::parse())
}
