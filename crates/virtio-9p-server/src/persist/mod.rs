// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A session that outlives its process: what the crate saves of a
//! session, where, and how a new process takes it back.
//!
//! - **Handover and live migration.** [`Server::save_session`] turns a
//!   drained session into bytes and [`Server::restore_session`] (or
//!   [`Server::restore_migrated_session`]) rebuilds it in another process
//!   over the same export.
//! - **A daemon killed at any instant.** [`Server::journal_session`] keeps
//!   the session in a state directory as a snapshot and a journal of fid
//!   changes; [`Server::recover_session`] rebuilds it from them.
//! - **Exactly once across the kill.** The device records every chain it
//!   takes in `session.inflight`, and a successor serves a request the
//!   killed daemon took and did not answer from that record.
//!
//! | file | what it holds |
//! |---|---|
//! | `session_format.rs` | the byte format of a saved session (fids, msize, the filesystem's state) |
//! | `snapshot_journal.rs` | the files of a crash-safe session: `session.snap`, the mapped `session.journal`, their replay |
//! | `inflight_table.rs` | `session.inflight`: one slot per ring position for the chains the device took, and what the server records in a slot and reads back (`RequestRecord`, `Left`) |
//! | `save_restore.rs` | `Server::save_session`, `restore_session`, `restore_migrated_session` and the migration lock calls |
//! | `crash_log.rs` | the journal writer of one session (`CrashLog`), `Server::journal_session` and `recover_session` |
//! | `exactly_once.rs` | what the server records while a request runs, and `Server::recover` for a request left unanswered |
//!
//! The first three are formats and files: they use nothing of the server,
//! so the server, the virtio queue and the vhost-user backend build on
//! them. The last three are `impl Server` blocks over the fid table; they
//! define no type the server names (`CrashLog` aside, which holds the
//! server it journals for), so the server does not import them back.
//!
//! Two parts live elsewhere on purpose. A filesystem names its own inodes
//! ([`Filesystem::save_inode`](crate::fs::Filesystem::save_inode)); the
//! passthrough's naming works on its private inode table, in
//! `fs/passthrough/inode_naming.rs` (the bytes in `saved_inode.rs`). The
//! daemon's `--state-dir` (the checks that a directory is safe to hold the
//! state, its lock, the handover file `session.state`) is policy of the
//! binary, in `src/daemon/state_dir.rs`: the library only takes the
//! directory as an fd.
//!
//! [`Server::save_session`]: crate::Server::save_session
//! [`Server::restore_session`]: crate::Server::restore_session
//! [`Server::restore_migrated_session`]: crate::Server::restore_migrated_session
//! [`Server::journal_session`]: crate::Server::journal_session
//! [`Server::recover_session`]: crate::Server::recover_session

pub(crate) mod crash_log;
pub(crate) mod exactly_once;
pub(crate) mod inflight_table;
pub(crate) mod save_restore;
pub(crate) mod session_format;
pub(crate) mod snapshot_journal;
