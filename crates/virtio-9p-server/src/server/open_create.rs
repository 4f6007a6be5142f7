// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Opening and creating: Tlopen, Tlcreate, Tmkdir, Tsymlink, Tmknod.

use super::session::{Fid, FidKind};
use super::{errno, Blocking, OpResult, Server, Session};
use crate::fs::{validate_name, Filesystem};
use crate::protocol::*;

impl<F: Filesystem> Server<F> {
    pub(super) fn lopen<B: Blocking>(
        &self,
        session: &Session<F>,
        m: &Tlopen,
        exec: &B,
    ) -> OpResult {
        let fid = session.get(m.fid)?;
        if !matches!(fid.kind, FidKind::Path) {
            return Err(errno::EBADF);
        }
        let charge = session.charge_open(&self.limits(), false)?;
        let (file, qid) = self
            .call(exec, MsgType::Tlopen, || self.fs.open(&fid.inode, m.flags))
            .map_err(|e| errno::from_io(&e))?;
        let entry = Fid {
            inode: fid.inode.clone(),
            uid: fid.uid,
            kind: FidKind::Open {
                file,
                flags: m.flags,
                locks: Default::default(),
                charge,
            },
        };
        session.replace_if(m.fid, &fid, entry)?;
        Ok(Rmessage::Lopen(qid, 0))
    }

    pub(super) fn lcreate<B: Blocking>(
        &self,
        session: &Session<F>,
        m: &Tlcreate,
        exec: &B,
    ) -> OpResult {
        validate_name(&m.name).map_err(|e| errno::from_io(&e))?;
        let fid = session.get(m.fid)?;
        if !matches!(fid.kind, FidKind::Path) {
            return Err(errno::EBADF);
        }
        let cred = fid.cred(m.gid);
        let charge = session.charge_open(&self.limits(), false)?;
        let (inode, file, qid) = self
            .call(exec, MsgType::Tlcreate, || {
                self.fs.create(&fid.inode, &m.name, m.flags, m.mode, cred)
            })
            .map_err(|e| errno::from_io(&e))?;
        let entry = Fid {
            inode,
            uid: fid.uid,
            kind: FidKind::Open {
                file,
                flags: m.flags,
                locks: Default::default(),
                charge,
            },
        };
        session.replace_if(m.fid, &fid, entry)?;
        Ok(Rmessage::Lcreate(qid, 0))
    }

    pub(super) fn mkdir<B: Blocking>(
        &self,
        session: &Session<F>,
        m: &Tmkdir,
        exec: &B,
    ) -> OpResult {
        self.create_entry(session, m.dfid, &m.name, exec, MsgType::Tmkdir, |fs, f| {
            let cred = f.cred(m.gid);
            fs.mkdir(&f.inode, &m.name, m.mode, cred)
                .map(Rmessage::Mkdir)
        })
    }

    pub(super) fn symlink<B: Blocking>(
        &self,
        session: &Session<F>,
        m: &Tsymlink,
        exec: &B,
    ) -> OpResult {
        self.create_entry(session, m.fid, &m.name, exec, MsgType::Tsymlink, |fs, f| {
            let cred = f.cred(m.gid);
            fs.symlink(&f.inode, &m.name, &m.symtgt, cred)
                .map(Rmessage::Symlink)
        })
    }

    pub(super) fn mknod<B: Blocking>(
        &self,
        session: &Session<F>,
        m: &Tmknod,
        exec: &B,
    ) -> OpResult {
        self.create_entry(session, m.dfid, &m.name, exec, MsgType::Tmknod, |fs, f| {
            let cred = f.cred(m.gid);
            let rdev = libc::makedev(m.major, m.minor);
            fs.mknod(&f.inode, &m.name, m.mode, rdev, cred)
                .map(Rmessage::Mknod)
        })
    }
}
