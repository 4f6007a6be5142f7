// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Suite `virtio-9p`: 9P request costs of `virtio-9p-server` against
//! crosvm's `p9` crate, in process, with the same request stream.
//!
//! The parts live in `virtio_9p/`: `inproc.rs` drives the server directly,
//! `vhost.rs` through a fake VMM over vhost-user, `diod.rs` over a unix
//! socket against diod, and `splice.rs` measures the socket transport's
//! zero-copy Rread. The socket parts share `socket_client.rs` (the load
//! generator) and `peers.rs` (our server and diod, the processes they
//! talk to). `restart.rs` is a suite of its own, `virtio-9p-restart`, and so is
//! `datapath.rs`, `virtio-9p-datapath`.

pub mod datapath;
mod diod;
mod inproc;
mod peers;
pub mod restart;
mod socket_client;
mod splice;
mod vhost;

pub use peers::serve_socket_forever;

use crate::harness::{Ctx, SuiteReport, SuiteResult};

/// One-line description.
pub const ABOUT: &str = "9P: in process vs crosvm p9 0.3.2, vhost-user by msize with 4 KiB IOPS pool on/off, unix socket vs diod";
/// Ready to run.
pub const READY: bool = true;

/// The parts of the suite, for `--part`.
const PARTS: [&str; 3] = ["inproc", "vhost", "diod"];

/// Runs every part of the suite (or those `--part` names).
pub fn run(ctx: &Ctx) -> SuiteResult {
    if PARTS.iter().all(|p| !ctx.runs_part(p)) {
        return Err(format!(
            "no part of virtio-9p selected; its parts: {}",
            PARTS.join(", ")
        )
        .into());
    }
    let mut report = if ctx.runs_part("inproc") {
        inproc::run(ctx)?
    } else {
        SuiteReport::default()
    };
    if ctx.runs_part("vhost") {
        vhost::run(ctx, &mut report)?;
    }
    if ctx.runs_part("diod") {
        diod::run(ctx, &mut report)?;
    }
    Ok(report)
}
