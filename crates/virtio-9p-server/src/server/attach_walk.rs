// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Session setup and fid lifecycle: Tversion, Tattach, Twalk, Tclunk.

use log::debug;

use super::session::{Fid, FidKind};
use super::{errno, Blocking, OpResult, Server, Session, NOBODY, NONUNAME};
use crate::fs::{validate_walk_name, Cred, Filesystem};
use crate::protocol::*;

impl<F: Filesystem> Server<F> {
    /// Tversion: negotiates the msize and resets the session.
    pub(super) fn version(&self, session: &Session<F>, m: &Tversion) -> Rmessage {
        let msize = m.msize.min(self.config.msize_max);
        if msize < MIN_MSIZE {
            if self.log.admit() {
                debug!(
                    "9p: client msize {} is below the minimum {MIN_MSIZE}",
                    m.msize
                );
            }
            session.reset(0);
            return Rmessage::Lerror(errno::EINVAL);
        }
        // Only "9P2000.L" and its extensions ("9P2000.L.xyz") are spoken.
        if !m.version.starts_with(VERSION_9P2000_L) {
            session.reset(0);
            return Rmessage::Version(Rversion {
                msize,
                version: VERSION_UNKNOWN.to_vec(),
            });
        }
        session.reset(msize);
        Rmessage::Version(Rversion {
            msize,
            version: VERSION_9P2000_L.to_vec(),
        })
    }

    pub(super) fn attach<B: Blocking>(
        &self,
        session: &Session<F>,
        m: &Tattach,
        exec: &B,
    ) -> OpResult {
        if m.afid != NOFID {
            return Err(errno::EINVAL);
        }
        let uid = if m.n_uname == NONUNAME {
            NOBODY
        } else {
            m.n_uname
        };
        let (inode, qid) = self
            .call(exec, MsgType::Tattach, || {
                self.fs.attach(&m.aname, Cred { uid, gid: uid })
            })
            .map_err(|e| errno::from_io(&e))?;
        let fid = Fid {
            inode,
            uid,
            kind: FidKind::Path,
        };
        session.insert_new(m.fid, fid, &self.limits())?;
        Ok(Rmessage::Attach(qid))
    }

    pub(super) fn walk<B: Blocking>(&self, session: &Session<F>, m: Twalk, exec: &B) -> OpResult {
        let fid = session.get(m.fid)?;
        if matches!(fid.kind, FidKind::XattrRead(..) | FidKind::XattrWrite(_)) {
            return Err(errno::EINVAL);
        }
        if m.newfid != m.fid && session.get(m.newfid).is_ok() {
            return Err(errno::EBADF);
        }
        if m.newfid == m.fid && m.wnames.is_empty() {
            // A walk of nothing onto itself changes nothing (an open fid
            // stays open).
            return Ok(Rmessage::Walk(Vec::new()));
        }
        let (inode, qids) = self.call(exec, MsgType::Twalk, || {
            let mut inode = fid.inode.clone();
            let mut qids = Vec::with_capacity(m.wnames.len());
            for name in &m.wnames {
                let step = validate_walk_name(name).and_then(|_| self.fs.walk(&inode, name));
                match step {
                    Ok((next, qid)) => {
                        inode = next;
                        qids.push(qid);
                    }
                    Err(e) if qids.is_empty() => return Err(errno::from_io(&e)),
                    Err(_) => break,
                }
            }
            Ok((inode, qids))
        })?;
        if qids.len() == m.wnames.len() {
            let entry = Fid {
                inode,
                uid: fid.uid,
                kind: FidKind::Path,
            };
            if m.newfid == m.fid {
                session.replace(m.newfid, entry, &self.limits())?;
            } else {
                session.insert_new(m.newfid, entry, &self.limits())?;
            }
        }
        Ok(Rmessage::Walk(qids))
    }

    /// Tclunk; an xattr writer commits its value here.
    pub(super) fn clunk<B: Blocking>(&self, session: &Session<F>, fid: u32, exec: &B) -> OpResult {
        let fid = session.remove(fid)?;
        if let FidKind::XattrWrite(w) = &fid.kind {
            self.commit_xattr(&fid, w, exec)?;
        }
        // The fid's last reference closes its files (`close` may flush to
        // a network server), so the drop is a filesystem call too; an
        // executor that cancels it before it ran drops the fid here.
        let _ = self.call(exec, MsgType::Tclunk, move || {
            drop(fid);
            Ok::<(), u32>(())
        });
        Ok(Rmessage::Clunk)
    }
}
