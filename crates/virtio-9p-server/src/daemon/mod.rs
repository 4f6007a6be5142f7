// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The daemon shell of the `virtio-9p-server` binary: command line, logger
//! setup, pid file, signals and the vhost-user run loop. None of it is part
//! of the library (see "Library and daemon" in the README).

pub mod cli;
pub mod error;
pub mod keeper;
pub mod pidfile;
pub mod sandbox;
pub mod signals;
pub mod state_dir;
pub mod syslog;
pub mod vhost_mode;

pub use error::{Error, Result};
