use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    sluice::cli::run(sluice::cli::Cli::parse())
}
