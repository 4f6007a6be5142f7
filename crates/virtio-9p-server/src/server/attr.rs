// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Attributes: Tgetattr, Tsetattr, Tstatfs, Treadlink.

use super::session::FidKind;
use super::{errno, Blocking, OpResult, Server, Session};
use crate::fs::Filesystem;
use crate::protocol::*;

impl<F: Filesystem> Server<F> {
    /// The attributes of Tgetattr (the caller encodes the reply, see
    /// `Server::handle_recorded`), or the errno of its Rlerror.
    pub(super) fn getattr<B: Blocking>(
        &self,
        session: &Session<F>,
        m: &Tgetattr,
        exec: &B,
    ) -> std::result::Result<Rgetattr, u32> {
        let iounit = session.msize().saturating_sub(IOHDRSZ);
        let fid = session.get(m.fid)?;
        self.call(exec, MsgType::Tgetattr, || {
            self.fs.getattr(&fid.inode, m.request_mask)
        })
        .map(|mut a| {
            a.blksize = io_block_size(a.blksize, iounit);
            a
        })
        .map_err(|e| errno::from_io(&e))
    }

    pub(super) fn setattr<B: Blocking>(
        &self,
        session: &Session<F>,
        m: &Tsetattr,
        exec: &B,
    ) -> OpResult {
        self.with_inode(session, m.fid, exec, MsgType::Tsetattr, |fs, f| {
            let file = match &f.kind {
                FidKind::Open { file, .. } => Some(file),
                _ => None,
            };
            fs.setattr(&f.inode, file, m).map(|_| Rmessage::Setattr)
        })
    }

    pub(super) fn statfs<B: Blocking>(&self, session: &Session<F>, fid: u32, exec: &B) -> OpResult {
        let iounit = session.msize().saturating_sub(IOHDRSZ);
        self.with_inode(session, fid, exec, MsgType::Tstatfs, |fs, f| {
            fs.statfs(&f.inode)
                .map(|st| Rmessage::Statfs(statfs_in_iounits(st, iounit)))
        })
    }

    pub(super) fn readlink<B: Blocking>(
        &self,
        session: &Session<F>,
        fid: u32,
        exec: &B,
    ) -> OpResult {
        self.with_inode(session, fid, exec, MsgType::Treadlink, |fs, f| {
            fs.readlink(&f.inode).map(Rmessage::Readlink)
        })
    }
}

/// The preferred I/O size a client sees in Tgetattr: the largest multiple
/// of the host's `blksize` that fits one Tread or Twrite (`iounit`, msize
/// minus the I/O header), as QEMU's 9p server reports it. The host's own
/// 4 KiB would make `cat`, `cp` and friends move 128 KiB per system call
/// where one request carries up to `iounit`.
fn io_block_size(blksize: u64, iounit: u32) -> u64 {
    let iounit = u64::from(iounit);
    if iounit == 0 {
        return blksize;
    }
    match blksize {
        0 => iounit,
        b if b >= iounit => b,
        b => iounit / b * b,
    }
}

/// Rstatfs with its block size scaled up to a multiple of the host's that
/// fits `iounit`, and the block counts scaled down to match, as QEMU's 9p
/// server does (tools size their I/O by `f_bsize`, and xfstests' O_DIRECT
/// tests need it above the direct-I/O alignment).
fn statfs_in_iounits(mut st: Rstatfs, iounit: u32) -> Rstatfs {
    if st.bsize == 0 || iounit <= st.bsize {
        return st;
    }
    let factor = iounit / st.bsize;
    st.bsize *= factor;
    st.blocks /= u64::from(factor);
    st.bfree /= u64::from(factor);
    st.bavail /= u64::from(factor);
    st
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_io_block_size_is_the_iounit_in_host_blocks() {
        assert_eq!(io_block_size(4096, 512_000 - IOHDRSZ), 507_904);
        assert_eq!(io_block_size(4096, 4096 - IOHDRSZ), 4096);
        assert_eq!(io_block_size(0, 8192), 8192);
        assert_eq!(io_block_size(4096, 0), 4096);
        assert_eq!(io_block_size(1 << 20, 65_536), 1 << 20);
    }

    #[test]
    fn test_statfs_scales_blocks_with_the_block_size() {
        let host = Rstatfs {
            bsize: 4096,
            blocks: 1_000_000,
            bfree: 500_000,
            bavail: 400_000,
            files: 77,
            ..Default::default()
        };
        let st = statfs_in_iounits(host, 512_000 - IOHDRSZ);
        assert_eq!(st.bsize, 4096 * 124);
        assert_eq!(
            (st.blocks, st.bfree, st.bavail, st.files),
            (1_000_000 / 124, 500_000 / 124, 400_000 / 124, 77)
        );
        assert_eq!(statfs_in_iounits(host, 4000), host);
        assert_eq!(statfs_in_iounits(host, 0), host);
    }
}
