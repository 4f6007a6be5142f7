// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The 9P execution policy: which requests' filesystem calls leave the
//! engine's thread ([`OffloadPolicy`], the [`Blocking`] executor
//! [`EngineExec`] the engine hands to the server), and which finished
//! request gets no reply ([`flushed_silently`]). See "What runs where" in
//! the engine's docs.

use std::time::Duration;

use crate::exec::{Blocking, CallHint, Cancel, Interrupted};
use crate::protocol::MsgType;

use super::coroutine::{flush, offload, offload_in, on_coroutine, sleep};

/// Which filesystem calls leave the engine's thread (see the module docs,
/// "What runs where").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OffloadPolicy {
    /// Tread inline when the filesystem's reads go through the reply
    /// writer ([`Filesystem::reads_through_writer`](crate::fs::Filesystem::reads_through_writer)),
    /// each range read in place when cached and on a worker otherwise;
    /// Tgetattr, Twalk, Tclunk, Tstatfs,
    /// Treadlink and Txattrwalk inline when the filesystem says its
    /// metadata calls are local
    /// ([`Filesystem::metadata_is_local`](crate::fs::Filesystem::metadata_is_local));
    /// everything else, and every call of a filesystem that does not say
    /// so, on a worker (default).
    #[default]
    Auto,
    /// Every call on a worker, including cached reads.
    Always,
    /// Every call inline on the engine's thread (no worker hop; a slow
    /// filesystem call stalls every request of the queue). For measurements.
    Never,
}

/// Whether a finished request's reply is dropped: it was flushed and
/// interrupted before it answered (an Rlerror after its [`Cancel`] was
/// set). A request that completed keeps its reply, which may record a
/// change; QEMU does the same.
pub(crate) fn flushed_silently(reply_type: u8, cancel: &Cancel) -> bool {
    cancel.is_cancelled() && reply_type == MsgType::Rlerror
}

/// The requests whose filesystem calls run inline on the engine's thread
/// under [`OffloadPolicy::Auto`] when the filesystem says its metadata
/// calls are local ([`Filesystem::metadata_is_local`]): they only read
/// metadata (Tclunk: the `close` of the fid's fds; its xattr commit is a
/// separate Txattrcreate call) and return within a disk access there.
/// Treaddir stays on a worker (a large cold directory reads many blocks,
/// and there is no cheap cache hint for directories), as does every call
/// that changes the tree, Tlock, Tgetlock, Tfsync, Tlopen and Tattach.
///
/// [`Filesystem::metadata_is_local`]: crate::fs::Filesystem::metadata_is_local
pub(super) const INLINE_IF_LOCAL: [MsgType; 6] = [
    MsgType::Tgetattr,
    MsgType::Twalk,
    MsgType::Tclunk,
    MsgType::Tstatfs,
    MsgType::Treadlink,
    MsgType::Txattrwalk,
];

/// The [`Blocking`] executor the engine hands to the server.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EngineExec {
    pub(super) policy: OffloadPolicy,
}

impl EngineExec {
    /// An executor with `policy`.
    pub fn new(policy: OffloadPolicy) -> Self {
        EngineExec { policy }
    }
}

impl Blocking for EngineExec {
    fn run<R: Interrupted + Send>(&self, op: MsgType, f: impl FnOnce() -> R + Send) -> R {
        match self.policy {
            OffloadPolicy::Never => f(),
            OffloadPolicy::Always => offload(f),
            OffloadPolicy::Auto if op == MsgType::Tversion => f(),
            OffloadPolicy::Auto if op == MsgType::Tlock => offload_in(true, f),
            OffloadPolicy::Auto => offload(f),
        }
    }

    fn run_hinted<R: Interrupted + Send>(
        &self,
        op: MsgType,
        hint: CallHint,
        f: impl FnOnce() -> R + Send,
    ) -> R {
        let inline = match hint {
            CallHint::MayBlock => false,
            // The reply writer places each range (`read_at`).
            CallHint::ReadsThroughWriter => on_coroutine(),
            // A short metadata call on a local filesystem: cheaper than the
            // thread hop, and it cannot hang on a peer.
            CallHint::LocalMetadata => INLINE_IF_LOCAL.contains(&op),
        };
        if self.policy == OffloadPolicy::Auto && inline {
            f()
        } else {
            self.run(op, f)
        }
    }

    fn read_at<R: Interrupted + Send>(
        &self,
        cached: impl FnOnce() -> bool,
        read: impl FnOnce() -> R + Send,
    ) -> R {
        // Only an inline Tread (`run_hinted`) reads on the engine's
        // thread: there a range that may block goes to a worker. Anywhere
        // else (a worker, `Never`, off the engine) the read runs here.
        if self.policy == OffloadPolicy::Auto && on_coroutine() && !cached() {
            offload(read)
        } else {
            read()
        }
    }

    fn sleep(&self, d: Duration) {
        // On a coroutine: a timer, no thread held (a waiting Tlock).
        sleep(d);
    }

    fn flush(&self, oldtag: u16) {
        // The engine owns Tflush: cancel `oldtag` and wait for its end.
        flush(oldtag);
    }
}
