// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Names in directories: Tlink, Trename, Trenameat, Tunlinkat, Tremove.

use super::{errno, Blocking, OpResult, Server, Session};
use crate::fs::{validate_name, Filesystem};
use crate::protocol::*;

impl<F: Filesystem> Server<F> {
    pub(super) fn link<B: Blocking>(&self, session: &Session<F>, m: &Tlink, exec: &B) -> OpResult {
        validate_name(&m.name).map_err(|e| errno::from_io(&e))?;
        let dir = session.get(m.dfid)?;
        let target = session.get(m.fid)?;
        self.call(exec, MsgType::Tlink, || {
            self.fs.link(&target.inode, &dir.inode, &m.name)
        })
        .map_err(|e| errno::from_io(&e))?;
        Ok(Rmessage::Link)
    }

    pub(super) fn rename<B: Blocking>(
        &self,
        session: &Session<F>,
        m: &Trename,
        exec: &B,
    ) -> OpResult {
        validate_name(&m.name).map_err(|e| errno::from_io(&e))?;
        let fid = session.get(m.fid)?;
        let dir = session.get(m.dfid)?;
        self.call(exec, MsgType::Trename, || {
            self.fs.rename(&fid.inode, &dir.inode, &m.name)
        })
        .map_err(|e| errno::from_io(&e))?;
        Ok(Rmessage::Rename)
    }

    pub(super) fn renameat<B: Blocking>(
        &self,
        session: &Session<F>,
        m: &Trenameat,
        exec: &B,
    ) -> OpResult {
        validate_name(&m.oldname).map_err(|e| errno::from_io(&e))?;
        validate_name(&m.newname).map_err(|e| errno::from_io(&e))?;
        let old = session.get(m.olddirfid)?;
        let new = session.get(m.newdirfid)?;
        self.call(exec, MsgType::Trenameat, || {
            self.fs
                .renameat(&old.inode, &m.oldname, &new.inode, &m.newname)
        })
        .map_err(|e| errno::from_io(&e))?;
        Ok(Rmessage::Renameat)
    }

    pub(super) fn unlinkat<B: Blocking>(
        &self,
        session: &Session<F>,
        m: &Tunlinkat,
        exec: &B,
    ) -> OpResult {
        self.create_entry(
            session,
            m.dirfid,
            &m.name,
            exec,
            MsgType::Tunlinkat,
            |fs, f| {
                if !(m.flags - UnlinkFlags::REMOVEDIR).is_empty() {
                    return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
                }
                fs.unlinkat(&f.inode, &m.name, m.flags)
                    .map(|_| Rmessage::Unlinkat)
            },
        )
    }

    /// Tremove clunks the fid even when the removal fails. The file goes
    /// first, the fid after: a daemon killed in between leaves a fid
    /// whose file is gone, which its successor can tell from a removal
    /// that did not happen (`recover`). The fid is claimed first: a
    /// Tclunk or Tremove of it sent meanwhile gets `EBADF`, so exactly one
    /// request releases it.
    pub(super) fn remove<B: Blocking>(&self, session: &Session<F>, fid: u32, exec: &B) -> OpResult {
        let entry = session.claim_removal(fid)?;
        let res = self.call(exec, MsgType::Tremove, || self.fs.remove(&entry.inode));
        session.release_claimed(fid);
        res.map_err(|e| errno::from_io(&e))?;
        Ok(Rmessage::Remove)
    }
}
