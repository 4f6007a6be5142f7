// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Byte-range locks: Tlock (blocking ones built from non-blocking tries)
//! and Tgetlock.

use std::time::{Duration, Instant};

use super::session::FidKind;
use super::{errno, Blocking, Cancel, OpResult, Server, Session};
use crate::fs::Filesystem;
use crate::protocol::*;

/// Longest pause between two attempts of a waiting Tlock: a lock released
/// on the host reaches a waiting guest within about this long.
pub(crate) const LOCK_RETRY_MAX: Duration = Duration::from_millis(20);

impl<F: Filesystem> Server<F> {
    /// Tlock. A blocking lock ([`LockFlags::BLOCK`]) that finds the lock
    /// taken waits here, retrying with a backoff of at most
    /// [`LOCK_RETRY_MAX`], until it is granted, the request is cancelled
    /// (Tflush, reset, session end: EINTR), its waits are ended (the
    /// device stops: [`LockStatus::Blocked`], which the client retries) or
    /// [`Config::lock_wait`](super::Config) has passed (`Blocked`). At most
    /// [`Config::max_lock_waiters`](super::Config) wait per session; the
    /// next one answers `Blocked` at once.
    pub(super) fn lock<B: Blocking>(
        &self,
        session: &Session<F>,
        m: &Tlock,
        exec: &B,
        cancel: &Cancel,
    ) -> OpResult {
        // The lock type was checked at decode (EINVAL).
        let wait = m.flags.contains(LockFlags::BLOCK) && m.ty != LockType::Unlck;
        let lock_wait = self.config.lock_wait;
        let fid = session.get(m.fid)?;
        let FidKind::Open { file, locks, .. } = &fid.kind else {
            return Err(errno::EBADF);
        };
        let start = Instant::now();
        let mut pause = Duration::from_micros(500);
        let mut waiting = None;
        loop {
            // One attempt per call: between attempts the request waits in
            // `exec.sleep`, which holds no worker on a coroutine engine.
            let status = self
                .call(exec, TLOCK, || self.fs.try_lock(file, m))
                .map_err(|e| errno::from_io(&e))?;
            if status == LockStatus::Success {
                // Kept for a restart, which takes the same locks again.
                locks.lock().unwrap_or_else(|e| e.into_inner()).record(m);
            }
            if status != LockStatus::Blocked || !wait {
                return Ok(Rmessage::Lock(status));
            }
            if cancel.is_cancelled() {
                return Err(errno::EINTR);
            }
            if cancel.waits_ended() || lock_wait.is_some_and(|w| start.elapsed() >= w) {
                return Ok(Rmessage::Lock(LockStatus::Blocked));
            }
            if waiting.is_none() {
                waiting = session.start_lock_wait(self.config.max_lock_waiters);
                if waiting.is_none() {
                    return Ok(Rmessage::Lock(LockStatus::Blocked));
                }
            }
            exec.sleep(pause);
            pause = (pause * 2).min(LOCK_RETRY_MAX);
        }
    }

    pub(super) fn getlock<B: Blocking>(
        &self,
        session: &Session<F>,
        m: &Tgetlock,
        exec: &B,
    ) -> OpResult {
        self.with_file(session, m.fid, exec, TGETLOCK, |fs, file| {
            fs.getlock(file, m).map(Rmessage::Getlock)
        })
    }
}
