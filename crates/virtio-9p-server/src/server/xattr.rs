// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Extended attributes: Txattrwalk (read a value or the name list into a
//! fid), Txattrcreate (turn a fid into a writer, committed on Tclunk).

use std::sync::Mutex;

use super::session::{Fid, FidKind, XattrWrite};
use super::{errno, Blocking, OpResult, Server, Session, MAX_XATTR_NAME};
use crate::fs::Filesystem;
use crate::io::RequestReader;
use crate::protocol::*;

impl<F: Filesystem> Server<F> {
    pub(super) fn xattrwalk<B: Blocking>(
        &self,
        session: &Session<F>,
        m: &Txattrwalk,
        exec: &B,
    ) -> OpResult {
        if m.name.len() > MAX_XATTR_NAME {
            return Err(libc::ERANGE as u32);
        }
        let fid = session.get(m.fid)?;
        if m.newfid != m.fid && session.get(m.newfid).is_ok() {
            return Err(errno::EBADF);
        }
        let max = self.config.max_xattr_size;
        // Reserve the largest value before reading it, so concurrent walks
        // cannot overshoot the limits; keep only what the value needs.
        let mut charge = session.charge_xattr(max, &self.limits())?;
        let value = self
            .call(exec, MsgType::Txattrwalk, || {
                if m.name.is_empty() {
                    self.fs.listxattr(&fid.inode, max)
                } else {
                    self.fs.getxattr(&fid.inode, &m.name, max)
                }
            })
            .map_err(|e| errno::from_io(&e))?;
        let value = value.into_boxed_slice().into_vec();
        charge.shrink_to(value.len());
        let size = value.len() as u64;
        let entry = Fid {
            inode: fid.inode.clone(),
            uid: fid.uid,
            kind: FidKind::XattrRead(value, charge),
        };
        if m.newfid == m.fid {
            session.replace(m.newfid, entry, &self.limits())?;
        } else {
            session.insert_new(m.newfid, entry, &self.limits())?;
        }
        Ok(Rmessage::Xattrwalk(size))
    }

    pub(super) fn xattrcreate(&self, session: &Session<F>, m: Txattrcreate) -> OpResult {
        if m.name.is_empty() || m.name.len() > MAX_XATTR_NAME {
            return Err(errno::EINVAL);
        }
        if m.attr_size > self.config.max_xattr_size as u64 {
            return Err(errno::E2BIG);
        }
        if m.flags & !(libc::XATTR_CREATE | libc::XATTR_REPLACE) as u32 != 0 {
            return Err(errno::EINVAL);
        }
        let fid = session.get(m.fid)?;
        if !matches!(fid.kind, FidKind::Path) {
            return Err(errno::EBADF);
        }
        let size = m.attr_size as usize;
        let charge = session.charge_xattr(size, &self.limits())?;
        let entry = Fid {
            inode: fid.inode.clone(),
            uid: fid.uid,
            kind: FidKind::XattrWrite(Mutex::new(XattrWrite {
                name: m.name,
                size,
                flags: m.flags,
                data: Vec::new(),
                _charge: charge,
            })),
        };
        session.replace_if(m.fid, &fid, entry)?;
        Ok(Rmessage::Xattrcreate)
    }

    /// The Tclunk of an xattr writer: sets the value (or removes the
    /// attribute: size 0 with `XATTR_REPLACE`); `EINVAL` if fewer bytes
    /// than declared were written.
    pub(super) fn commit_xattr<B: Blocking>(
        &self,
        fid: &Fid<F>,
        w: &Mutex<XattrWrite>,
        exec: &B,
    ) -> Result<(), u32> {
        let w = w.lock().unwrap_or_else(|e| e.into_inner());
        if w.data.len() != w.size {
            return Err(errno::EINVAL);
        }
        self.call(exec, MsgType::Txattrcreate, || {
            if w.size == 0 && w.flags == libc::XATTR_REPLACE as u32 {
                self.fs.removexattr(&fid.inode, &w.name)
            } else {
                self.fs.setxattr(&fid.inode, &w.name, &w.data, w.flags)
            }
        })
        .map_err(|e| errno::from_io(&e))
    }

    /// A Twrite to an xattr writer: appends to the buffered value, in
    /// order and within the declared size. The data (at most the value's
    /// size, [`Config::max_xattr_size`](super::Config)) is read before the
    /// writer's lock is taken: a streamed request may wait for its bytes
    /// ([`RequestReader::wait_ready`], its coroutine yields), and no lock
    /// is held across a wait.
    pub(super) fn write_xattr<R: RequestReader>(
        w: &Mutex<XattrWrite>,
        req: &mut R,
        offset: u64,
        count: u32,
    ) -> crate::Result<OpResult> {
        let n = count as usize;
        let fits = |w: &XattrWrite| offset == w.data.len() as u64 && w.data.len() + n <= w.size;
        if !fits(&w.lock().unwrap_or_else(|e| e.into_inner())) {
            return Ok(Err(errno::EINVAL));
        }
        let mut data = vec![0u8; n];
        let mut got = 0;
        while got < n {
            let ready = match req.wait_ready() {
                Ok(r) => r,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => return Ok(Err(errno::EINTR)),
                Err(e) => return Err(crate::Error::Transport(e)),
            };
            let k = ready.min(n - got);
            if k == 0 {
                return Err(crate::Error::Transport(
                    std::io::ErrorKind::UnexpectedEof.into(),
                ));
            }
            req.read_exact(&mut data[got..got + k])
                .map_err(crate::Error::Transport)?;
            got += k;
        }
        let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
        // Another Twrite of the same fid may have got there first.
        if !fits(&w) {
            return Ok(Err(errno::EINVAL));
        }
        // Exactly the declared size: what the charge covers.
        let want = w.size - w.data.len();
        w.data.reserve_exact(want);
        w.data.extend_from_slice(&data);
        Ok(Ok(Rmessage::Write(count)))
    }
}
