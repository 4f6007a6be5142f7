//! `vmm-benches`: runs benchmark suites that compare this workspace's crates
//! with their peers (QEMU, crosvm's p9, diod, virtio-queue) and prints one
//! markdown table per suite.
//!
//! ```text
//! cargo run --release -p vmm-benches -- list
//! cargo run --release -p vmm-benches -- selftest
//! cargo run --release -p vmm-benches -- --quick all
//! ```

mod harness;
mod suites;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use harness::Ctx;

/// Runs the named benchmark suites and writes `<out-dir>/<suite>.json`.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Small sizes and one repetition: checks that the suites still run.
    #[arg(long)]
    quick: bool,
    /// Alternating repetitions per comparison; the median is reported.
    #[arg(long, default_value_t = harness::DEFAULT_REPS)]
    reps: usize,
    /// Where the JSON results go (default: `<target>/bench`).
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// Suites to run, `all`, or `list` to show them.
    #[arg(required = true)]
    suites: Vec<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.suites.iter().any(|s| s == "list") {
        for suite in suites::SUITES {
            println!("{:<18} {}", suite.name, suite.about);
        }
        return ExitCode::SUCCESS;
    }
    let selected = match suites::select(&args.suites) {
        Ok(selected) => selected,
        Err(msg) => {
            eprintln!("vmm-benches: {msg}");
            return ExitCode::FAILURE;
        }
    };
    let ctx = Ctx::new(args.quick, args.reps, args.out_dir);
    let mut failed = 0;
    for suite in &selected {
        if let Err(e) = harness::run_suite(&ctx, suite) {
            eprintln!("vmm-benches: suite {} failed: {e}", suite.name);
            failed += 1;
        }
    }
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
