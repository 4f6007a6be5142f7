// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Attributes: Tgetattr, Tsetattr, Tstatfs, Treadlink.

use super::session::FidKind;
use super::{Blocking, OpResult, Server, Session};
use crate::fs::Filesystem;
use crate::protocol::*;

impl<F: Filesystem> Server<F> {
    pub(super) fn getattr<B: Blocking>(
        &self,
        session: &Session<F>,
        m: &Tgetattr,
        exec: &B,
    ) -> OpResult {
        self.with_inode(session, m.fid, exec, TGETATTR, |fs, f| {
            fs.getattr(&f.inode, m.request_mask)
                .map(|a| Rmessage::Getattr(Box::new(a)))
        })
    }

    pub(super) fn setattr<B: Blocking>(
        &self,
        session: &Session<F>,
        m: &Tsetattr,
        exec: &B,
    ) -> OpResult {
        self.with_inode(session, m.fid, exec, TSETATTR, |fs, f| {
            let file = match &f.kind {
                FidKind::Open { file, .. } => Some(file),
                _ => None,
            };
            fs.setattr(&f.inode, file, m).map(|_| Rmessage::Setattr)
        })
    }

    pub(super) fn statfs<B: Blocking>(&self, session: &Session<F>, fid: u32, exec: &B) -> OpResult {
        self.with_inode(session, fid, exec, TSTATFS, |fs, f| {
            fs.statfs(&f.inode).map(Rmessage::Statfs)
        })
    }

    pub(super) fn readlink<B: Blocking>(
        &self,
        session: &Session<F>,
        fid: u32,
        exec: &B,
    ) -> OpResult {
        self.with_inode(session, fid, exec, TREADLINK, |fs, f| {
            fs.readlink(&f.inode).map(Rmessage::Readlink)
        })
    }
}
