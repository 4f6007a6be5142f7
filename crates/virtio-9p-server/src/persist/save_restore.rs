// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A session that outlives its process: saved to bytes, restored in a new
//! process over the same export (a daemon restarted or upgraded under a
//! running guest). The format is in [`session_format`](super::session_format).

use std::sync::Mutex;

use log::{error, warn};

use super::session_format::{SavedFid, SavedKind, SavedSession, MAX_INODE_ID};
use crate::error::{Error, Result, StateProblem};
use crate::fs::Filesystem;
use crate::protocol::{LockStatus, LockType, OpenFlags, Tlock, Tmessage};
use crate::server::session::{Fid, FidKind, LockLog, XattrWrite};
use crate::server::{Server, Session};

impl<F: Filesystem> Server<F> {
    /// The state of `session` as bytes: its msize, every fid (by
    /// [`Filesystem::save_inode`]) with its open flags, granted locks and
    /// xattr buffers, and the filesystem's own state. Save it only while
    /// no request of the session runs (after the device drained), so it
    /// is complete.
    ///
    /// Fails if the filesystem cannot name one of the fids' files.
    pub fn save_session(&self, session: &Session<F>) -> Result<Vec<u8>> {
        let mut saved = SavedSession {
            export_id: self.fs.export_id(),
            msize: session.msize(),
            fs_state: self.fs.save_state(),
            fids: Vec::new(),
        };
        for (fid, entry) in session.entries() {
            saved.fids.push(self.save_fid(fid, &entry)?);
        }
        Ok(saved.encode())
    }

    /// Live migration, on the source once the session is saved: releases
    /// the host POSIX locks of every open fid whose locks the state
    /// carries, so that the destination can take them again (on one host,
    /// or on a filesystem both hosts share, it could not while this process
    /// holds them). The fids keep their lock logs:
    /// [`Server::retake_locks`] takes the locks again when the migration
    /// fails and this device goes on. A fid whose log is incomplete keeps
    /// its locks (the state does not carry them). Returns how many fids
    /// released theirs.
    #[cfg(feature = "vhost-user")]
    pub(crate) fn release_locks(&self, session: &Session<F>) -> usize {
        let mut released = 0;
        for (fid, entry) in session.entries() {
            let FidKind::Open { file, locks, .. } = &entry.kind else {
                continue;
            };
            let log = locks.lock().unwrap_or_else(|e| e.into_inner());
            if log.granted.is_empty() || log.incomplete {
                continue;
            }
            let all = Tlock {
                fid,
                ty: LockType::Unlck,
                flags: crate::protocol::LockFlags::empty(),
                start: 0,
                length: 0,
                proc_id: 0,
                client_id: Vec::new(),
            };
            match self.fs.try_lock(file, &all) {
                Ok(_) => released += 1,
                Err(e) => error!("9p: migration: fid {fid}: cannot release its locks: {e}"),
            }
        }
        released
    }

    /// Takes again the locks [`Server::release_locks`] released (their
    /// logs replayed in order, as a restore does): the migration failed
    /// and this device serves the guest again. A lock another process took
    /// meanwhile is lost, with one log line. Returns (taken, lost).
    #[cfg(feature = "vhost-user")]
    pub(crate) fn retake_locks(&self, session: &Session<F>) -> (usize, usize) {
        let (mut taken, mut lost) = (0, 0);
        for (fid, entry) in session.entries() {
            let FidKind::Open { file, locks, .. } = &entry.kind else {
                continue;
            };
            let log = locks.lock().unwrap_or_else(|e| e.into_inner());
            if log.incomplete {
                continue;
            }
            for m in &log.granted {
                match self.fs.try_lock(file, m) {
                    Ok(LockStatus::Success) => taken += 1,
                    Ok(status) => {
                        lost += 1;
                        error!(
                            "9p: migration failed: fid {fid}: lock {:?} {}+{} lost ({status:?}): another process took it meanwhile",
                            m.ty, m.start, m.length
                        );
                    }
                    Err(e) => {
                        lost += 1;
                        error!("9p: migration failed: fid {fid}: lock lost: {e}");
                    }
                }
            }
        }
        (taken, lost)
    }

    /// One fid as saved state: its file by [`Filesystem::save_inode`],
    /// its open flags, granted locks or xattr buffer.
    pub(crate) fn save_fid(&self, fid: u32, entry: &Fid<F>) -> Result<SavedFid> {
        let inode = self
            .fs
            .save_inode(&entry.inode)
            .map_err(|source| Error::RestoreFid { fid, source })?;
        if inode.len() > MAX_INODE_ID {
            return Err(Error::State(StateProblem::Malformed("inode id too long")));
        }
        let kind = match &entry.kind {
            FidKind::Path => SavedKind::Walked,
            FidKind::Open { flags, locks, .. } => {
                let log = locks.lock().unwrap_or_else(|e| e.into_inner());
                SavedKind::Open {
                    flags: flags.bits(),
                    locks: (!log.incomplete).then(|| {
                        log.granted
                            .iter()
                            .map(|m| Tmessage::Lock(m.clone()).encode_frame(0))
                            .collect()
                    }),
                }
            }
            FidKind::XattrRead(value, _) => SavedKind::XattrRead(value.clone()),
            FidKind::XattrWrite(w) => {
                let w = w.lock().unwrap_or_else(|e| e.into_inner());
                SavedKind::XattrWrite {
                    name: w.name.clone(),
                    size: w.size as u32,
                    flags: w.flags,
                    data: w.data.clone(),
                }
            }
        };
        Ok(SavedFid {
            fid,
            uid: entry.uid,
            inode,
            kind,
        })
    }

    /// A session rebuilt from [`Server::save_session`]'s bytes: the same
    /// msize and fids, open files opened again (never created or
    /// truncated again), their locks taken again, xattr buffers back.
    ///
    /// State that is not state, cut short, damaged, from another format
    /// version or for another export is refused ([`Error::State`]), and so
    /// is a state with a fid whose saved file no honest save wrote (a
    /// handle that opens another file or another type:
    /// [`StateProblem::Forged`]); nothing of it is restored. A fid whose
    /// file is gone, replaced by another or moved out of the export is
    /// left out (the guest then gets `EBADF` for it), and a lock another
    /// process took meanwhile is lost; both are logged.
    pub fn restore_session(&self, bytes: &[u8]) -> Result<Session<F>> {
        self.restore(bytes, false)
    }

    /// [`Server::restore_session`] on the destination of a live
    /// migration: the same checks, but a fid whose file vanished or
    /// changed between the hosts answers `ESTALE` (until a Tclunk releases
    /// it, also answering `ESTALE`) instead of `EBADF`, and nothing else of
    /// the session fails. See "Live migration" in the crate README.
    pub fn restore_migrated_session(&self, bytes: &[u8]) -> Result<Session<F>> {
        self.restore(bytes, true)
    }

    fn restore(&self, bytes: &[u8], migrated: bool) -> Result<Session<F>> {
        let saved = SavedSession::decode(bytes).map_err(Error::State)?;
        let export = self.fs.export_id();
        if !saved.export_id.is_empty() && saved.export_id != export {
            return Err(Error::State(StateProblem::Foreign));
        }
        self.fs
            .restore_state(&saved.fs_state)
            .map_err(|_| Error::State(StateProblem::Malformed("filesystem state")))?;
        let session = Session::new();
        session.set_msize(saved.msize);
        let mut lost = 0usize;
        for f in saved.fids {
            match self.restore_fid(&session, &f) {
                Ok(()) => {}
                // Forged or malformed: nothing of this state is used.
                Err(Error::RestoreFid { fid, source })
                    if source.kind() == std::io::ErrorKind::InvalidData =>
                {
                    return Err(Error::State(StateProblem::Forged {
                        fid,
                        why: source.to_string(),
                    }));
                }
                Err(e @ Error::State(_)) => return Err(e),
                Err(e) => {
                    lost += 1;
                    if migrated {
                        warn!("9p: restore: fid {} answers ESTALE: {e}", f.fid);
                        session.mark_stale(f.fid);
                    } else {
                        warn!("9p: restore: fid {} left out: {e}", f.fid);
                    }
                }
            }
        }
        if lost > 0 {
            error!("9p: restore: {lost} fids could not be brought back");
        }
        Ok(session)
    }

    fn restore_fid(&self, session: &Session<F>, f: &SavedFid) -> Result<()> {
        let fid = f.fid;
        let (inode, _qid) = self
            .fs
            .restore_inode(&f.inode)
            .map_err(|source| Error::RestoreFid { fid, source })?;
        let limits = self.limits();
        let kind = match &f.kind {
            SavedKind::Walked => FidKind::Path,
            SavedKind::Open { flags, locks } => {
                let flags = OpenFlags::from_bits_retain(*flags);
                let reopen = flags - (OpenFlags::CREATE | OpenFlags::EXCL | OpenFlags::TRUNC);
                // The file description a lock keeper held through the
                // crash, if any: its locks never left.
                let (file, kept) = match self.adopt_kept(fid, &inode, reopen) {
                    Some((file, kept)) => (file, Some(kept)),
                    None => self
                        .fs
                        .open(&inode, reopen)
                        .map(|(file, _)| (file, None))
                        .map_err(|source| Error::RestoreFid { fid, source })?,
                };
                let adopted = kept.is_some();
                let mut log = LockLog {
                    kept,
                    ..LockLog::default()
                };
                match locks {
                    None => {
                        error!("9p: restore: fid {fid} had more locks than were kept; none taken again");
                        log.incomplete = true;
                    }
                    Some(frames) => {
                        for frame in frames {
                            let Some(m) = decode_lock(frame) else {
                                return Err(Error::State(StateProblem::Malformed("saved lock")));
                            };
                            match self.fs.try_lock(&file, &m) {
                                Ok(LockStatus::Success) => {
                                    if !adopted && m.ty != LockType::Unlck {
                                        self.lock_retaken(fid, &m);
                                    }
                                    log.record(&m)
                                }
                                Ok(status) => error!(
                                    "9p: restore: fid {fid}: lock {:?} {}+{} lost ({status:?}): another process holds it now",
                                    m.ty, m.start, m.length
                                ),
                                Err(e) => error!("9p: restore: fid {fid}: lock lost: {e}"),
                            }
                        }
                    }
                }
                if !adopted {
                    self.keep_locks(fid, &file, log.holds_locks(), &mut log.kept);
                }
                FidKind::Open {
                    file,
                    flags,
                    locks: Mutex::new(log),
                    // It was open before the restart: counted, not refused.
                    charge: session
                        .charge_open(&limits, true)
                        .map_err(|e| restore_errno(fid, e))?,
                }
            }
            SavedKind::XattrRead(value) => {
                let charge = session
                    .charge_xattr(value.len(), &limits)
                    .map_err(|e| restore_errno(fid, e))?;
                FidKind::XattrRead(value.clone(), charge)
            }
            SavedKind::XattrWrite {
                name,
                size,
                flags,
                data,
            } => {
                let size = *size as usize;
                if data.len() > size || size > self.config.max_xattr_size {
                    return Err(Error::State(StateProblem::Malformed("xattr buffer")));
                }
                let charge = session
                    .charge_xattr(size, &limits)
                    .map_err(|e| restore_errno(fid, e))?;
                FidKind::XattrWrite(Mutex::new(XattrWrite {
                    name: name.clone(),
                    size,
                    flags: *flags,
                    data: data.clone(),
                    _charge: charge,
                }))
            }
        };
        let entry = Fid {
            inode,
            uid: f.uid,
            kind,
        };
        session
            .insert_new(fid, entry, &limits)
            .map_err(|e| restore_errno(fid, e))
    }
}

fn restore_errno(fid: u32, errno: u32) -> Error {
    Error::RestoreFid {
        fid,
        source: std::io::Error::from_raw_os_error(errno as i32),
    }
}

/// A Tlock saved as a whole frame.
fn decode_lock(frame: &[u8]) -> Option<Tlock> {
    match Tmessage::decode_frame(frame, crate::protocol::MIN_MSIZE).ok()? {
        (_, Tmessage::Lock(m)) => Some(m),
        _ => None,
    }
}
