// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The socket threads of a listener ("Threads" in the module docs): the
//! hub hands each new connection to the least busy one.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use log::error;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::connection::{run_thread, Shared, ThreadCtx};
use super::limits::SocketLimits;
use crate::fs::Filesystem;
use crate::server::Server;
use crate::sys::set_nonblocking;

/// The socket threads of one listener.
pub(super) struct Hub {
    threads: Vec<ThreadHandle>,
    /// Connections served, on all threads.
    active: Arc<AtomicUsize>,
}

/// The hub's end of one socket thread: where to send it a connection,
/// and how many it serves.
struct ThreadHandle {
    tx: mpsc::Sender<OwnedFd>,
    wake: EventFd,
    conns: Arc<AtomicUsize>,
}

impl Hub {
    pub(super) fn start<F: Filesystem + 'static>(
        server: Arc<Server<F>>,
        limits: &SocketLimits,
    ) -> io::Result<Hub> {
        let shared = Shared::new(server, limits)?;
        let active = Arc::new(AtomicUsize::new(0));
        let mut threads = Vec::new();
        for i in 0..limits.threads.max(1) {
            let (tx, rx) = mpsc::channel();
            let wake = EventFd::new(EFD_NONBLOCK)?;
            let conns = Arc::new(AtomicUsize::new(0));
            let ctx = ThreadCtx {
                shared: shared.clone(),
                rx,
                wake: wake.try_clone()?,
                conns: Arc::clone(&conns),
                active: Arc::clone(&active),
            };
            std::thread::Builder::new()
                .name(format!("9p-sock-{i}"))
                .spawn(move || {
                    if let Err(e) = run_thread(ctx, false) {
                        error!("9p: socket thread stopped: {e}");
                    }
                })?;
            threads.push(ThreadHandle { tx, wake, conns });
        }
        Ok(Hub { threads, active })
    }

    /// Connections served now.
    pub(super) fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// Hands `fd` to the socket thread with the fewest connections.
    pub(super) fn add(&self, fd: OwnedFd) -> io::Result<()> {
        let t = self
            .threads
            .iter()
            .min_by_key(|t| t.conns.load(Ordering::Acquire))
            .ok_or_else(|| io::Error::other("no socket thread"))?;
        set_nonblocking(fd.as_raw_fd())?;
        self.active.fetch_add(1, Ordering::AcqRel);
        t.conns.fetch_add(1, Ordering::AcqRel);
        if t.tx.send(fd).is_err() {
            self.active.fetch_sub(1, Ordering::AcqRel);
            t.conns.fetch_sub(1, Ordering::AcqRel);
            return Err(io::Error::other("the socket thread has stopped"));
        }
        t.wake.write(1)
    }
}

/// Serves one client on `stream` on the calling thread, on an engine of
/// its own (with the default [`SocketLimits`]), until it hangs up (`Ok`)
/// or breaks the framing (`Err`). [`Listener::serve_with`](super::Listener::serve_with) is what the
/// daemon runs; this is the same loop for one connection.
pub fn serve_connection<F, S>(server: &Arc<Server<F>>, stream: S) -> io::Result<()>
where
    F: Filesystem + 'static,
    S: AsFd,
{
    let fd = stream.as_fd().try_clone_to_owned()?;
    drop(stream);
    set_nonblocking(fd.as_raw_fd())?;
    let limits = SocketLimits::default();
    let shared = Shared::new(Arc::clone(server), &limits)?;
    let (tx, rx) = mpsc::channel();
    let wake = EventFd::new(EFD_NONBLOCK)?;
    tx.send(fd)
        .map_err(|_| io::Error::other("channel closed"))?;
    wake.write(1)?;
    let ctx = ThreadCtx {
        shared,
        rx,
        wake,
        conns: Arc::new(AtomicUsize::new(1)),
        active: Arc::new(AtomicUsize::new(1)),
    };
    run_thread(ctx, true)
}
