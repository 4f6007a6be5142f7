// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Byte-range locks: Tlock (blocking ones built from non-blocking tries)
//! and Tgetlock.

use std::time::{Duration, Instant};

use super::session::FidKind;
use super::{errno, Blocking, Cancel, OpResult, Server, Session};
use crate::fs::Filesystem;
use crate::protocol::*;

/// Longest pause between two attempts of a waiting Tlock while few wait:
/// a lock released on the host reaches a waiting guest within about this
/// long.
pub(crate) const LOCK_RETRY_MAX: Duration = Duration::from_millis(20);

/// Past this many waiting Tlocks in the server, the longest pause grows
/// with their number, so their retries together stay near this many per
/// [`LOCK_RETRY_MAX`] (3200 a second): 2048 waiters otherwise cost a
/// core in retries alone.
const WAITERS_AT_FULL_RATE: usize = 64;

/// The longest pause however many wait.
const LOCK_RETRY_CEILING: Duration = Duration::from_secs(1);

/// How often a waiting Tlock whose waits are held (the device is paused,
/// [`Cancel::hold_waits`](crate::Cancel::hold_waits)) looks again; the
/// device releases it at once when the ring starts again, this is only
/// the fallback.
const HELD_POLL: Duration = Duration::from_millis(100);

/// The longest pause between attempts with `waiters` Tlocks waiting.
fn retry_max(waiters: usize) -> Duration {
    let scale = u32::try_from(waiters.div_ceil(WAITERS_AT_FULL_RATE).max(1)).unwrap_or(u32::MAX);
    LOCK_RETRY_MAX.saturating_mul(scale).min(LOCK_RETRY_CEILING)
}

impl<F: Filesystem> Server<F> {
    /// Tlock. A blocking lock ([`LockFlags::BLOCK`]) that finds the lock
    /// taken waits here, retrying with a backoff of at most
    /// [`LOCK_RETRY_MAX`] (longer when many wait: [`retry_max`]), until it is granted, the request is cancelled
    /// (Tflush, reset, session end: EINTR), its waits are ended (a
    /// handover or shutdown: [`LockStatus::Blocked`], which the client
    /// retries) or
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
            if waiting.is_some() && cancel.waits_held() {
                // The device is paused with this request in flight: no
                // attempt (a grant's reply could not go out) until the
                // ring starts again, when the waits are released.
                if cancel.is_cancelled() {
                    return Err(errno::EINTR);
                }
                if cancel.waits_ended() {
                    return Ok(Rmessage::Lock(LockStatus::Blocked));
                }
                exec.sleep(HELD_POLL);
                continue;
            }
            // One attempt per call: between attempts the request waits in
            // `exec.sleep`, which holds no worker on a coroutine engine.
            let status = self
                .call(exec, MsgType::Tlock, || self.fs.try_lock(file, m))
                .map_err(|e| errno::from_io(&e))?;
            if status == LockStatus::Success {
                // Kept for a restart, which takes the same locks again;
                // the file description goes to the lock keeper, if any,
                // before the guest hears of the grant.
                let mut log = locks.lock().unwrap_or_else(|e| e.into_inner());
                log.record(m);
                self.keep_locks(m.fid, file, log.holds_locks(), &mut log.kept);
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
                waiting = session.start_lock_wait(self.config.max_lock_waiters, &self.usage);
                if waiting.is_none() {
                    return Ok(Rmessage::Lock(LockStatus::Blocked));
                }
            }
            exec.sleep(pause);
            let waiters = waiting.as_ref().map_or(1, |w| w.server_wide());
            pause = (pause * 2).min(retry_max(waiters));
        }
    }

    pub(super) fn getlock<B: Blocking>(
        &self,
        session: &Session<F>,
        m: &Tgetlock,
        exec: &B,
    ) -> OpResult {
        self.with_file(session, m.fid, exec, MsgType::Tgetlock, |fs, file| {
            fs.getlock(file, m).map(Rmessage::Getlock)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_retry_pause_grows_with_the_waiters_to_a_ceiling() {
        assert_eq!(retry_max(1), LOCK_RETRY_MAX);
        assert_eq!(retry_max(WAITERS_AT_FULL_RATE), LOCK_RETRY_MAX);
        assert_eq!(retry_max(WAITERS_AT_FULL_RATE + 1), LOCK_RETRY_MAX * 2);
        assert_eq!(retry_max(2048), LOCK_RETRY_MAX * 32);
        assert_eq!(retry_max(1 << 20), LOCK_RETRY_CEILING);
        assert_eq!(retry_max(usize::MAX), LOCK_RETRY_CEILING);
    }
}
