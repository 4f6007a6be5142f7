// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Byte-range locks: Tlock (blocking ones built from non-blocking tries)
//! and Tgetlock.

use std::time::{Duration, Instant};

use super::session::FidKind;
use super::{errno, Blocking, Cancel, OpResult, Server, Session};
use crate::fs::Filesystem;
use crate::protocol::*;

impl<F: Filesystem> Server<F> {
    /// Tlock. A blocking lock ([`LockFlags::BLOCK`]) retries with backoff until
    /// granted, cancelled (EINTR) or [`Config::lock_wait`](super::Config)
    /// has passed ([`LockStatus::Blocked`]).
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
        let FidKind::Open { file } = &fid.kind else {
            return Err(errno::EBADF);
        };
        let start = Instant::now();
        let mut pause = Duration::from_micros(500);
        loop {
            // One attempt per call: between attempts the request waits in
            // `exec.sleep`, which holds no worker on a coroutine engine.
            let status = self
                .call(exec, TLOCK, || self.fs.try_lock(file, m))
                .map_err(|e| errno::from_io(&e))?;
            if status != LockStatus::Blocked || !wait {
                return Ok(Rmessage::Lock(status));
            }
            if cancel.is_cancelled() {
                return Err(errno::EINTR);
            }
            if lock_wait.is_some_and(|w| start.elapsed() >= w) {
                return Ok(Rmessage::Lock(LockStatus::Blocked));
            }
            exec.sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
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
