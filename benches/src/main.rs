// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `vmm-benches`: runs benchmark suites that compare this workspace's crates
//! with their peers (QEMU, crosvm's p9, diod, virtio-queue) and prints one
//! markdown table per suite.
//!
//! ```text
//! cargo run --release -p vmm-benches -- list
//! cargo run --release -p vmm-benches -- selftest
//! cargo run --release -p vmm-benches -- --quick all
//! cargo run --release -p vmm-benches -- --part inproc virtio-9p # one part only
//! cargo run --release -p vmm-benches -- report      # regenerates BENCHMARKS.md
//! cargo run --release -p vmm-benches -- report-guest # only its guest section (docs/benchmarks/guest.md)
//! ```

mod harness;
mod machine;
mod plots;
mod report;
mod suites;
mod targets;

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
    /// Only this part of a suite that has parts (repeatable; virtio-9p:
    /// inproc, vhost, diod), for a quick A/B of one change. Not for
    /// `report`, which runs everything.
    #[arg(long = "part")]
    parts: Vec<String>,
    /// Suites to run, `all`, `list` to show them, `report` to run every
    /// suite and regenerate BENCHMARKS.md (with --quick: target/bench/BENCHMARKS.quick.md),
    /// or `report-guest` to copy docs/benchmarks/guest.md into its last section.
    #[arg(required = true)]
    suites: Vec<String>,
}

fn main() -> ExitCode {
    // The child process of the virtio-9p suite's idle-RSS figure.
    let raw: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if raw.len() == 4 && raw[1] == "__socket-server" {
        let (dir, sock) = (PathBuf::from(&raw[2]), PathBuf::from(&raw[3]));
        if let Err(e) = suites::virtio_9p_socket_server(&dir, &sock) {
            eprintln!("vmm-benches: socket server: {e}");
        }
        return ExitCode::FAILURE;
    }
    // The killed and restarted daemon of the virtio-9p-restart suite.
    if raw.len() == 5 && raw[1] == "__vhost-daemon" {
        let p = |i: usize| PathBuf::from(&raw[i]);
        if let Err(e) = suites::virtio_9p_vhost_daemon(&p(2), &p(3), &p(4)) {
            eprintln!("vmm-benches: vhost daemon: {e}");
        }
        return ExitCode::FAILURE;
    }
    let args = Args::parse();
    if args.suites.iter().any(|s| s == "list") {
        for suite in suites::SUITES {
            println!("{:<18} {}", suite.name, suite.about);
        }
        return ExitCode::SUCCESS;
    }
    if args.suites.iter().any(|s| s == "report-guest") {
        return match report::refresh_guest() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("vmm-benches: report-guest failed: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if args.suites.iter().any(|s| s == "report") {
        let ctx = Ctx::new(args.quick, args.reps, args.out_dir);
        return match report::run(&ctx) {
            Ok(0) => ExitCode::SUCCESS,
            Ok(failed) => {
                eprintln!("vmm-benches: {failed} suite(s) failed; the report says which");
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("vmm-benches: report failed: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let selected = match suites::select(&args.suites) {
        Ok(selected) => selected,
        Err(msg) => {
            eprintln!("vmm-benches: {msg}");
            return ExitCode::FAILURE;
        }
    };
    let ctx = Ctx::new(args.quick, args.reps, args.out_dir).with_parts(args.parts);
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
