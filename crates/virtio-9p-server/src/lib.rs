// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A 9P2000.L file server for VMMs: a library a VMM embeds, a plain socket
//! server and a vhost-user daemon.
//!
//! # Library and daemon
//!
//! With `default-features = false` the crate is the embeddable core:
//! [`protocol`], the [`Server`], the [`fs::Filesystem`] trait and
//! [`PassthroughFs`], [`io`], [`engine`], [`virtio`] and the socket
//! [`transport`], with the [`syscalls`] its threads make listed for an
//! embedder's seccomp filter. It never exits the process, installs no
//! signal handler and pulls in no CLI, logger backend, seccomp or vhost
//! crate. The
//! `vhost-user` feature adds the `vhost_user` backend and daemon loop
//! (vhost, vhost-user-backend); the `daemon` feature (default) adds the
//! binary and its hardening (clap, env_logger, seccompiler, mlock-policy),
//! which live in the binary's own modules.
//!
//! Outside [`protocol`] the no-default-features library has at most 80
//! named public items (types, traits, free functions, constants), each one
//! an embedder uses; `ci/public-items.sh` counts them from rustdoc JSON and
//! fails above that.
//!
//! Follow one request through the crate:
//!
//! 1. a transport frames it and hands the bytes over as a
//!    [`RequestReader`] with room for the reply as a [`ReplyWriter`]
//!    ([`io`]; [`transport::socket`] does it for unix and TCP sockets);
//! 2. [`Server::handle`] decodes it strictly ([`protocol`]), looks up the
//!    fids of its [`Session`] and runs the operation through a
//!    [`Blocking`] executor;
//! 3. a [`fs::Filesystem`] does the work; [`PassthroughFs`] serves a host
//!    directory on `O_PATH` fds and never resolves outside it;
//! 4. the reply goes back into the [`ReplyWriter`] (Rread data straight from
//!    `preadv`, Twrite data straight into `pwritev`).
//!
//! ```
//! use virtio_9p_server::io::{SliceReader, SliceWriter};
//! use virtio_9p_server::protocol::{Rmessage, Rversion, Tmessage, Tversion};
//! use virtio_9p_server::{Cancel, Config, Inline, PassthroughConfig, PassthroughFs, Server, Session};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let fs = PassthroughFs::new(PassthroughConfig::new(dir.path())).unwrap();
//! let server = Server::new(fs, Config::default()).unwrap();
//! let session = Session::new();
//!
//! let request = Tmessage::Version(Tversion { msize: 65536, version: b"9P2000.L".to_vec() })
//!     .encode_frame(0xffff);
//! let mut reply = vec![0u8; 65536];
//! let info = server
//!     .handle(&session, &mut SliceReader::new(&request), &mut SliceWriter::new(&mut reply),
//!             &Inline, &Cancel::new())
//!     .unwrap();
//! let (_, msg) = Rmessage::decode_frame(&reply[..info.size as usize], 65536).unwrap();
//! assert_eq!(msg, Rmessage::Version(Rversion { msize: 65536, version: b"9P2000.L".to_vec() }));
//! ```
//!
//! # Live migration
//!
//! A session (msize, fids, open files, granted locks, xattr fids) moves
//! to another process or host as bytes: [`Server::save_session`] on the
//! source once its queue drained, [`Server::restore_migrated_session`] on
//! the destination, whose export holds the same tree, maybe at another
//! path. Name the export the same on both
//! ([`PassthroughConfig::export_name`]) and, for another host, find
//! files by path ([`MigrationMode::FindPaths`]). A stream that is
//! truncated, damaged, of another version or for another export is
//! refused ([`Error::State`]); a fid whose file vanished answers
//! `ESTALE`. The vhost-user backend carries the same bytes over
//! `VHOST_USER_PROTOCOL_F_DEVICE_STATE` and logs its guest-memory writes
//! for the dirty bitmap (see "Live migration" in the README).
//!
//! ```
//! use virtio_9p_server::{Config, MigrationMode, PassthroughConfig, PassthroughFs, Server, Session};
//! let server = |dir: &std::path::Path| {
//!     let mut cfg = PassthroughConfig::new(dir);
//!     cfg.export_name = Some("vol".into());
//!     cfg.migration_mode = MigrationMode::FindPaths;
//!     Server::new(PassthroughFs::new(cfg).unwrap(), Config::default()).unwrap()
//! };
//! let (here, there) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
//! let source = server(here.path());
//! let session: Session<PassthroughFs> = Session::new();
//! // ... the guest's requests run on `session`; its queue drains; then:
//! let bytes = source.save_session(&session).unwrap();
//! let restored = server(there.path()).restore_migrated_session(&bytes).unwrap();
//! # drop(restored);
//! // Another export name: refused, the source goes on.
//! let mut other = PassthroughConfig::new(there.path());
//! other.export_name = Some("other".into());
//! let other = Server::new(PassthroughFs::new(other).unwrap(), Config::default()).unwrap();
//! assert!(other.restore_migrated_session(&bytes).is_err());
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

// The README is the crate's crates.io page: its example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme_doctest {}

pub mod bound;
pub mod error;
mod exec;
pub mod fs;
pub mod io;
mod persist;
pub mod protocol;
mod server;
mod sys;
pub mod syscalls;
pub mod transport;

// The virtio transport and the coroutine engine.
pub mod engine;
pub mod virtio;

// Behind a feature (see "Features" in the README): the
// vhost-user backend needs vhost and vhost-user-backend. The sandbox is the
// binary's hardening, not library code: it lives in the binary's own
// module tree (src/daemon/sandbox/, declared by src/daemon/mod.rs), so it
// is no public item of this crate even with `daemon`.
#[cfg(feature = "vhost-user")]
#[cfg_attr(docsrs, doc(cfg(feature = "vhost-user")))]
pub mod vhost_user;

#[cfg(any(test, feature = "test-utils"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-utils")))]
pub mod client;

pub use error::{Error, Result};
pub use exec::{Blocking, CallHint, Cancel, Inline, Interrupted};
pub use fs::passthrough::{
    MigrationMode, PassthroughConfig, PassthroughError, PassthroughFs, SecurityModel,
};
pub use io::{ReplyWriter, RequestReader};
pub use server::{
    Config, LockKeeper, Reply, Server, Session, DEFAULT_MAX_FIDS, DEFAULT_MAX_LOCK_WAITERS,
    DEFAULT_MAX_TOTAL_FIDS, DEFAULT_MAX_TOTAL_XATTR_BYTES, DEFAULT_MAX_XATTR_BYTES, MAX_XATTR_NAME,
    MAX_XATTR_SIZE,
};
