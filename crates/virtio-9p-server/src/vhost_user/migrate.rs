// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The device-state channel of a live migration
//! (`VHOST_USER_PROTOCOL_F_DEVICE_STATE`): SET_DEVICE_STATE_FD hands the
//! backend a pipe, the saved 9P session goes through it on a thread of its
//! own (the vhost-user handler must not block on it), and
//! CHECK_DEVICE_STATE waits for that thread and, on the destination,
//! restores the session before the ring starts.
//!
//! The bytes are [`Server::save_session`](crate::Server::save_session)'s:
//! versioned, checksummed, naming the export (see `persist::session_format`).

use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::Mutex;
use std::thread::JoinHandle;

/// Largest device state a destination reads: far above any honest state
/// (a million fids of short paths is about 130 MiB), so a peer cannot
/// make the daemon buffer without end.
pub(super) const MAX_DEVICE_STATE: u64 = 512 << 20;

/// A transfer under way.
enum Pending {
    /// Writing the saved session to the frontend's fd.
    Save(JoinHandle<io::Result<()>>),
    /// Reading a session from the frontend's fd.
    Load(JoinHandle<io::Result<Vec<u8>>>),
}

/// The transfer a SET_DEVICE_STATE_FD started, until CHECK_DEVICE_STATE.
#[derive(Default)]
pub(super) struct Transfer(Mutex<Option<Pending>>);

impl std::fmt::Debug for Transfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Transfer")
    }
}

impl Transfer {
    fn set(&self, p: Pending) -> io::Result<()> {
        let mut cur = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if cur.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                "a device state transfer is already under way",
            ));
        }
        *cur = Some(p);
        Ok(())
    }

    /// Writes `bytes` to `file` on a thread of its own, then closes it
    /// (the frontend reads to end of file).
    pub(super) fn start_save(&self, bytes: Vec<u8>, mut file: File) -> io::Result<()> {
        let t = std::thread::Builder::new()
            .name("v9p-state-save".into())
            .spawn(move || file.write_all(&bytes))?;
        self.set(Pending::Save(t))
    }

    /// Reads `file` to its end (at most [`MAX_DEVICE_STATE`] bytes) on a
    /// thread of its own.
    pub(super) fn start_load(&self, file: File) -> io::Result<()> {
        let t = std::thread::Builder::new()
            .name("v9p-state-load".into())
            .spawn(move || {
                let mut out = Vec::new();
                file.take(MAX_DEVICE_STATE + 1).read_to_end(&mut out)?;
                if out.len() as u64 > MAX_DEVICE_STATE {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("device state larger than {MAX_DEVICE_STATE} bytes"),
                    ));
                }
                Ok(out)
            })?;
        self.set(Pending::Load(t))
    }

    /// Waits for the transfer: `Some(bytes)` read by a load, `None` after
    /// a save (or when none was started).
    pub(super) fn finish(&self) -> io::Result<Option<Vec<u8>>> {
        let pending = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        let panicked = || io::Error::other("the device state thread panicked");
        match pending {
            None => Ok(None),
            Some(Pending::Save(t)) => t.join().map_err(|_| panicked())?.map(|()| None),
            Some(Pending::Load(t)) => t.join().map_err(|_| panicked())?.map(Some),
        }
    }
}
