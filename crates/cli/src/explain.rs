//! `sluice explain`: the code catalogue from the command line.

use clap::Args;

use sluice_core::errors::{Code, CodedError};

/// Flags of `sluice explain`.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The code, e.g. RT0024 or META0009.
    #[arg(required_unless_present_any = ["list", "markdown"])]
    pub code: Option<String>,
    /// List every code with its one-line summary.
    #[arg(long, conflicts_with = "code")]
    pub list: bool,
    /// Print the catalogue as the Markdown table of docs/errors.md.
    #[arg(long, conflicts_with_all = ["code", "list"])]
    pub markdown: bool,
}

/// Prints what was asked.
pub fn run(args: &ExplainArgs) -> Result<(), CodedError> {
    if args.markdown {
        print!("{}", Code::markdown_table());
    } else if args.list {
        for code in Code::ALL {
            println!("{:<9} {}", code.as_str(), code.info().summary);
        }
    } else if let Some(text) = &args.code {
        match text.parse::<Code>() {
            Ok(code) => print!("{}", code.explain()),
            Err(e) => {
                let code =
                    Code::renumbered(text).ok_or_else(|| CodedError::uncoded(format!("{e}")))?;
                println!(
                    "{} is Sluice's old number for {code}: the reference server uses RT numbers in order, so Sluice's own codes moved to prefixes of their own.\n",
                    text.trim().to_ascii_uppercase()
                );
                print!("{}", code.explain());
            }
        }
    }
    Ok(())
}
