// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Directory listing: Treaddir.

use super::{Blocking, OpResult, Server, Session, RHDR_COUNT};
use crate::fs::Filesystem;
use crate::protocol::*;

impl<F: Filesystem> Server<F> {
    /// Treaddir: as many entries as fit `count`, the msize and `room` (the
    /// reply buffer).
    pub(super) fn readdir<B: Blocking>(
        &self,
        session: &Session<F>,
        m: &Treaddir,
        room: usize,
        msize: u32,
        exec: &B,
    ) -> OpResult {
        let max = (m.count as usize)
            .min(msize as usize - RHDR_COUNT)
            .min(room.saturating_sub(RHDR_COUNT));
        self.with_file(session, m.fid, exec, MsgType::Treaddir, |fs, file| {
            let mut data = Vec::with_capacity(max.min(64 << 10));
            fs.readdir(file, m.offset, &mut |entry| {
                if data.len() + entry.size() > max {
                    return false;
                }
                entry.encode(&mut data);
                true
            })?;
            Ok(Rmessage::Readdir(data))
        })
    }
}
