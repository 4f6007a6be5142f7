// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! File data: Tread (from `preadv` straight into the reply), Twrite (from
//! the request buffers straight into `pwritev`) and Tfsync.

use log::debug;

use super::session::FidKind;
use super::{errno, Blocking, OpResult, Reply, Server, Session, RHDR_COUNT};
use crate::error::{Error, Result};
use crate::fs::Filesystem;
use crate::io::{ReplyWriter, RequestReader};
use crate::protocol::*;

impl<F: Filesystem> Server<F> {
    pub(super) fn read<W: ReplyWriter + Send, B: Blocking>(
        &self,
        session: &Session<F>,
        h: &Header,
        m: &Tread,
        reply: &mut W,
        exec: &B,
        msize: u32,
    ) -> Result<Reply> {
        let fid = match session.get(m.fid) {
            Ok(f) => f,
            Err(e) => return self.send(reply, h, Err(e), msize),
        };
        let count = (m.count as usize)
            .min(msize as usize - RHDR_COUNT)
            .min(reply.available_bytes() - RHDR_COUNT);
        let result = match &fid.kind {
            FidKind::Open { file, .. } => {
                let mut data = reply.split_at(RHDR_COUNT).map_err(Error::Transport)?;
                self.call(exec, MsgType::Tread, || {
                    self.fs.read(file, &mut data, count, m.offset)
                })
                .map_err(|e| errno::from_io(&e))
            }
            FidKind::XattrRead(value, _) => {
                let start = (m.offset.min(value.len() as u64)) as usize;
                let end = value.len().min(start + count);
                let mut frame = Rmessage::Read(value[start..end].to_vec()).encode_frame(h.tag);
                if frame.len() > reply.available_bytes() {
                    frame = Rmessage::Lerror(errno::EMSGSIZE).encode_frame(h.tag);
                }
                reply.write_all(&frame).map_err(Error::Transport)?;
                return Ok(Reply {
                    tag: h.tag,
                    request_type: h.ty,
                    reply_type: frame[4],
                    size: frame.len() as u32,
                });
            }
            _ => Err(errno::EBADF),
        };
        match result {
            Ok(n) => {
                let size = (RHDR_COUNT + n) as u32;
                let rh = Header {
                    size,
                    ty: MsgType::Rread.into(),
                    tag: h.tag,
                };
                reply.write_all(&rh.to_bytes()).map_err(Error::Transport)?;
                reply
                    .write_all(&(n as u32).to_le_bytes())
                    .map_err(Error::Transport)?;
                Ok(Reply {
                    tag: h.tag,
                    request_type: h.ty,
                    reply_type: MsgType::Rread.into(),
                    size,
                })
            }
            Err(e) => self.send(reply, h, Err(e), msize),
        }
    }

    pub(super) fn write<R: RequestReader + Send, W: ReplyWriter, B: Blocking>(
        &self,
        session: &Session<F>,
        h: &Header,
        req: &mut R,
        reply: &mut W,
        exec: &B,
        msize: u32,
    ) -> Result<Reply> {
        let body_len = h.size as usize - HEADER_SIZE;
        if body_len < TwriteHeader::SIZE {
            let e = DecodeError::Truncated {
                needed: TwriteHeader::SIZE,
                left: body_len,
            };
            return self.malformed(reply, h, e, msize);
        }
        let mut raw = [0u8; TwriteHeader::SIZE];
        req.read_exact(&mut raw).map_err(Error::Transport)?;
        let m = match TwriteHeader::decode(&raw, body_len - TwriteHeader::SIZE) {
            Ok(m) => m,
            Err(e) => return self.malformed(reply, h, e, msize),
        };
        debug!("9p: tag {} {:?}", h.tag, m);
        let count = m.count as usize;
        let result = match session.get(m.fid) {
            Err(e) => Err(e),
            Ok(fid) => match &fid.kind {
                FidKind::Open { file, .. } => self.write_file(file, req, count, m.offset, exec)?,
                FidKind::XattrWrite(w) => {
                    let r = Self::write_xattr(w, req, m.offset, m.count)?;
                    // The buffer grew: a crash-safe session journals it.
                    session.touch(m.fid);
                    r
                }
                _ => Err(errno::EBADF),
            },
        };
        self.send(reply, h, result, msize)
    }

    /// The data of a Twrite to an open file, one filesystem call per
    /// chunk the request has ready ([`RequestReader::wait_ready`]): one
    /// call for a request in memory; for a streamed request, each call
    /// writes bytes already received, so no call waits for the network.
    /// A call that fails or writes short after some data was written ends
    /// the write with the count so far.
    fn write_file<R: RequestReader + Send, B: Blocking>(
        &self,
        file: &F::File,
        req: &mut R,
        count: usize,
        offset: u64,
        exec: &B,
    ) -> Result<OpResult> {
        let mut done = 0usize;
        while done < count {
            let ready = match req.wait_ready() {
                Ok(n) => n,
                Err(e) if done == 0 && e.raw_os_error() == Some(libc::EINTR) => {
                    return Ok(Err(errno::EINTR))
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => break,
                Err(e) => return Err(Error::Transport(e)),
            };
            let n = ready.min(count - done);
            if n == 0 {
                return Err(Error::Transport(std::io::ErrorKind::UnexpectedEof.into()));
            }
            let at = offset + done as u64;
            match self.call(exec, MsgType::Twrite, || self.fs.write(file, req, n, at)) {
                Ok(w) => {
                    done += w;
                    if w < n {
                        break;
                    }
                }
                Err(_) if done > 0 => break,
                Err(e) => return Ok(Err(errno::from_io(&e))),
            }
        }
        Ok(Ok(Rmessage::Write(done as u32)))
    }

    pub(super) fn fsync<B: Blocking>(
        &self,
        session: &Session<F>,
        m: &Tfsync,
        exec: &B,
    ) -> OpResult {
        self.with_file(session, m.fid, exec, MsgType::Tfsync, |fs, file| {
            fs.fsync(file, m.datasync != 0).map(|_| Rmessage::Fsync)
        })
    }
}
