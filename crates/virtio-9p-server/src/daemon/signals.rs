// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! SIGTERM, SIGINT and SIGHUP in vhost-user mode: the binary's handlers
//! stop the running [`Daemon`](virtio_9p_server::vhost_user::Daemon)
//! cleanly (exit 0) through its [`StopHandle::wake_fd`]. The library
//! installs no handler and keeps no process-global state; this module is
//! the binary's.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use virtio_9p_server::vhost_user::StopHandle;

/// The stop eventfd that the signal handler writes to.
static SIGNAL_FD: AtomicI32 = AtomicI32::new(-1);

/// Set by the signal handler, for a signal that comes before
/// [`stop_on_signal`] has published [`SIGNAL_FD`].
static SIGNALLED: AtomicBool = AtomicBool::new(false);

/// The handover eventfd that SIGUSR1's handler writes to.
static HANDOVER_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_handover(_sig: libc::c_int) {
    let fd = HANDOVER_FD.load(Ordering::Acquire);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: write(2) is async-signal-safe; `one` is valid for the call.
        unsafe {
            libc::write(fd, (&one as *const u64).cast(), 8);
        }
    }
}

extern "C" fn on_signal(_sig: libc::c_int) {
    SIGNALLED.store(true, Ordering::Release);
    let fd = SIGNAL_FD.load(Ordering::Acquire);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: write(2) is async-signal-safe; `one` is valid for the call.
        unsafe {
            libc::write(fd, (&one as *const u64).cast(), 8);
        }
    }
}

/// Makes SIGTERM, SIGINT and SIGHUP stop the daemon published with
/// [`stop_on_signal`], and with `handover` (`--state-dir`), SIGUSR1 hand
/// it over.
pub fn install(handover: bool) -> std::io::Result<()> {
    let mut sigs = vec![
        (libc::SIGTERM, on_signal as extern "C" fn(libc::c_int)),
        (libc::SIGINT, on_signal),
        (libc::SIGHUP, on_signal),
    ];
    if handover {
        sigs.push((libc::SIGUSR1, on_handover));
    }
    for (sig, handler) in sigs {
        // SAFETY: a zeroed sigaction is a valid starting point.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = handler as usize;
        sa.sa_flags = libc::SA_RESTART;
        // SAFETY: sa_mask is a valid sigset inside `sa`.
        unsafe { libc::sigemptyset(&mut sa.sa_mask) };
        // SAFETY: installs a handler that only calls async-signal-safe write(2).
        if unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    super::sandbox::unblock_stop_signals();
    Ok(())
}

/// While the returned guard lives, a signal stops the daemon of `stop`.
/// A signal that came before this call stops it at once.
pub fn stop_on_signal(stop: StopHandle) -> SignalGuard {
    SIGNAL_FD.store(stop.wake_fd(), Ordering::Release);
    HANDOVER_FD.store(stop.handover_fd(), Ordering::Release);
    if SIGNALLED.load(Ordering::Acquire) {
        stop.stop();
    }
    SignalGuard(stop)
}

/// Unpublishes the stop eventfd (before it can close) when dropped.
pub struct SignalGuard(StopHandle);

impl Drop for SignalGuard {
    fn drop(&mut self) {
        let _ =
            SIGNAL_FD.compare_exchange(self.0.wake_fd(), -1, Ordering::AcqRel, Ordering::Acquire);
        let _ = HANDOVER_FD.compare_exchange(
            self.0.handover_fd(),
            -1,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
}
