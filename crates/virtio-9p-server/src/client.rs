// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A small synchronous 9P2000.L client for tests, benchmarks and fuzzing
//! (feature `test-utils`).
//!
//! It talks either to an in-process [`Server`] ([`InProcess`]) or over any
//! byte stream ([`StreamTransport`], for the socket server). Rlerror replies
//! become `io::Error`s carrying the errno.

use std::io::{self, Read, Write};
use std::sync::Arc;

use crate::exec::{Cancel, Inline};
use crate::fs::Filesystem;
use crate::io::{SliceReader, SliceWriter};
use crate::protocol::*;
use crate::server::{Server, Session};

/// Moves one request frame to a server and returns the reply frame.
pub trait Transport {
    /// Sends `frame`, returns the reply.
    fn call(&mut self, frame: &[u8]) -> io::Result<Vec<u8>>;
}

/// Calls a server in the same process, with its own session.
#[derive(Debug)]
pub struct InProcess<F: Filesystem> {
    server: Arc<Server<F>>,
    session: Session<F>,
    reply: Vec<u8>,
}

impl<F: Filesystem> InProcess<F> {
    /// A new session on `server`; replies may be up to `reply_room` bytes.
    pub fn new(server: Arc<Server<F>>, reply_room: usize) -> Self {
        InProcess {
            server,
            session: Session::new(),
            reply: vec![0u8; reply_room],
        }
    }

    /// `session` (for example one brought back by
    /// [`Server::restore_session`]) on `server`.
    pub fn with_session(server: Arc<Server<F>>, session: Session<F>, reply_room: usize) -> Self {
        InProcess {
            server,
            session,
            reply: vec![0u8; reply_room],
        }
    }

    /// The session.
    pub fn session(&self) -> &Session<F> {
        &self.session
    }
}

impl<F: Filesystem> Transport for InProcess<F> {
    fn call(&mut self, frame: &[u8]) -> io::Result<Vec<u8>> {
        let out = self
            .server
            .handle(
                &self.session,
                &mut SliceReader::new(frame),
                &mut SliceWriter::new(&mut self.reply),
                &Inline,
                &Cancel::new(),
            )
            .map_err(io::Error::other)?;
        Ok(self.reply[..out.size as usize].to_vec())
    }
}

/// Calls a server over a byte stream.
#[derive(Debug)]
pub struct StreamTransport<S>(pub S);

impl<S: Read> StreamTransport<S> {
    /// Reads one reply frame: for a caller that keeps several requests in
    /// flight and writes them itself.
    pub fn read_frame(&mut self) -> io::Result<Vec<u8>> {
        let mut size = [0u8; 4];
        self.0.read_exact(&mut size)?;
        let n = u32::from_le_bytes(size) as usize;
        if n < HEADER_SIZE {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "short reply"));
        }
        let mut out = size.to_vec();
        out.resize(n, 0);
        self.0.read_exact(&mut out[4..])?;
        Ok(out)
    }
}

impl<S: Read + Write> Transport for StreamTransport<S> {
    fn call(&mut self, frame: &[u8]) -> io::Result<Vec<u8>> {
        self.0.write_all(frame)?;
        self.read_frame()
    }
}

/// A 9P2000.L client.
#[derive(Debug)]
pub struct Client<T> {
    t: T,
    msize: u32,
    tag: u16,
}

fn protocol_error(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

fn unexpected(r: Rmessage) -> io::Error {
    protocol_error(format!("unexpected reply {r:?}"))
}

impl<T: Transport> Client<T> {
    /// A client that has not negotiated yet.
    pub fn new(t: T) -> Self {
        Client {
            t,
            msize: MAX_MSIZE,
            tag: 0,
        }
    }

    /// The transport.
    pub fn transport(&mut self) -> &mut T {
        &mut self.t
    }

    /// The negotiated msize.
    pub fn msize(&self) -> u32 {
        self.msize
    }

    /// Sends a raw frame and decodes the reply (Rlerror stays a message).
    pub fn raw(&mut self, frame: &[u8]) -> io::Result<(u16, Rmessage)> {
        let reply = self.t.call(frame)?;
        Rmessage::decode_frame(&reply, MAX_MSIZE).map_err(protocol_error)
    }

    /// Sends a message; Rlerror becomes `Err` with its errno.
    pub fn rpc(&mut self, msg: &Tmessage) -> io::Result<Rmessage> {
        let tag = if matches!(msg, Tmessage::Version(_)) {
            NOTAG
        } else {
            self.tag = self.tag.wrapping_add(1) % NOTAG;
            self.tag
        };
        let (rtag, r) = self.raw(&msg.encode_frame(tag))?;
        if rtag != tag {
            return Err(protocol_error(format!(
                "reply tag {rtag} for request tag {tag}"
            )));
        }
        match r {
            Rmessage::Lerror(e) => Err(io::Error::from_raw_os_error(e as i32)),
            r => Ok(r),
        }
    }

    /// Tversion; returns the granted msize.
    pub fn version(&mut self, msize: u32) -> io::Result<u32> {
        match self.rpc(&Tmessage::Version(Tversion {
            msize,
            version: VERSION_9P2000_L.to_vec(),
        }))? {
            Rmessage::Version(v) if v.version == VERSION_9P2000_L => {
                self.msize = v.msize;
                Ok(v.msize)
            }
            r => Err(unexpected(r)),
        }
    }

    /// Tattach as numeric user `uid`.
    pub fn attach(&mut self, fid: u32, uid: u32) -> io::Result<Qid> {
        match self.rpc(&Tmessage::Attach(Tattach {
            fid,
            afid: NOFID,
            uname: b"user".to_vec(),
            aname: Vec::new(),
            n_uname: uid,
        }))? {
            Rmessage::Attach(q) => Ok(q),
            r => Err(unexpected(r)),
        }
    }

    /// Twalk of `/`-free names.
    pub fn walk(&mut self, fid: u32, newfid: u32, names: &[&[u8]]) -> io::Result<Vec<Qid>> {
        match self.rpc(&Tmessage::Walk(Twalk {
            fid,
            newfid,
            wnames: names.iter().map(|n| n.to_vec()).collect(),
        }))? {
            Rmessage::Walk(q) => Ok(q),
            r => Err(unexpected(r)),
        }
    }

    /// Tlopen.
    pub fn lopen(&mut self, fid: u32, flags: OpenFlags) -> io::Result<Qid> {
        match self.rpc(&Tmessage::Lopen(Tlopen { fid, flags }))? {
            Rmessage::Lopen(q, _) => Ok(q),
            r => Err(unexpected(r)),
        }
    }

    /// Tlcreate.
    pub fn lcreate(
        &mut self,
        fid: u32,
        name: &[u8],
        flags: OpenFlags,
        mode: u32,
        gid: u32,
    ) -> io::Result<Qid> {
        match self.rpc(&Tmessage::Lcreate(Tlcreate {
            fid,
            name: name.to_vec(),
            flags,
            mode,
            gid,
        }))? {
            Rmessage::Lcreate(q, _) => Ok(q),
            r => Err(unexpected(r)),
        }
    }

    /// Tread.
    pub fn read(&mut self, fid: u32, offset: u64, count: u32) -> io::Result<Vec<u8>> {
        match self.rpc(&Tmessage::Read(Tread { fid, offset, count }))? {
            Rmessage::Read(d) => Ok(d),
            r => Err(unexpected(r)),
        }
    }

    /// Twrite; returns the bytes written.
    pub fn write(&mut self, fid: u32, offset: u64, data: &[u8]) -> io::Result<u32> {
        match self.rpc(&Tmessage::Write(Twrite {
            fid,
            offset,
            data: data.to_vec(),
        }))? {
            Rmessage::Write(n) => Ok(n),
            r => Err(unexpected(r)),
        }
    }

    fn expect(&mut self, msg: Tmessage, want: Rmessage) -> io::Result<()> {
        let r = self.rpc(&msg)?;
        if r == want {
            Ok(())
        } else {
            Err(unexpected(r))
        }
    }

    /// Tclunk.
    pub fn clunk(&mut self, fid: u32) -> io::Result<()> {
        self.expect(Tmessage::Clunk(Tfid { fid }), Rmessage::Clunk)
    }

    /// Tremove.
    pub fn remove(&mut self, fid: u32) -> io::Result<()> {
        self.expect(Tmessage::Remove(Tfid { fid }), Rmessage::Remove)
    }

    /// Tflush.
    pub fn flush(&mut self, oldtag: u16) -> io::Result<()> {
        self.expect(Tmessage::Flush(Tflush { oldtag }), Rmessage::Flush)
    }

    /// Tgetattr of everything.
    pub fn getattr(&mut self, fid: u32) -> io::Result<Rgetattr> {
        match self.rpc(&Tmessage::Getattr(Tgetattr {
            fid,
            request_mask: GetattrMask::ALL,
        }))? {
            Rmessage::Getattr(a) => Ok(*a),
            r => Err(unexpected(r)),
        }
    }

    /// Tsetattr.
    pub fn setattr(&mut self, attr: Tsetattr) -> io::Result<()> {
        self.expect(Tmessage::Setattr(attr), Rmessage::Setattr)
    }

    /// Tstatfs.
    pub fn statfs(&mut self, fid: u32) -> io::Result<Rstatfs> {
        match self.rpc(&Tmessage::Statfs(Tfid { fid }))? {
            Rmessage::Statfs(s) => Ok(s),
            r => Err(unexpected(r)),
        }
    }

    /// Treaddir once.
    pub fn readdir(&mut self, fid: u32, offset: u64, count: u32) -> io::Result<Vec<DirEntry>> {
        match self.rpc(&Tmessage::Readdir(Treaddir { fid, offset, count }))? {
            Rmessage::Readdir(d) => DirEntry::decode_all(&d).map_err(protocol_error),
            r => Err(unexpected(r)),
        }
    }

    /// Treaddir until the end; returns every entry.
    pub fn readdir_all(&mut self, fid: u32, count: u32) -> io::Result<Vec<DirEntry>> {
        let mut out: Vec<DirEntry> = Vec::new();
        let mut offset = 0;
        loop {
            let batch = self.readdir(fid, offset, count)?;
            match batch.last() {
                None => return Ok(out),
                Some(last) => offset = last.offset,
            }
            out.extend(batch);
        }
    }

    /// Tfsync.
    pub fn fsync(&mut self, fid: u32, datasync: bool) -> io::Result<()> {
        self.expect(
            Tmessage::Fsync(Tfsync {
                fid,
                datasync: datasync as u32,
            }),
            Rmessage::Fsync,
        )
    }

    /// Tmkdir.
    pub fn mkdir(&mut self, dfid: u32, name: &[u8], mode: u32, gid: u32) -> io::Result<Qid> {
        match self.rpc(&Tmessage::Mkdir(Tmkdir {
            dfid,
            name: name.to_vec(),
            mode,
            gid,
        }))? {
            Rmessage::Mkdir(q) => Ok(q),
            r => Err(unexpected(r)),
        }
    }

    /// Tsymlink.
    pub fn symlink(&mut self, fid: u32, name: &[u8], target: &[u8], gid: u32) -> io::Result<Qid> {
        match self.rpc(&Tmessage::Symlink(Tsymlink {
            fid,
            name: name.to_vec(),
            symtgt: target.to_vec(),
            gid,
        }))? {
            Rmessage::Symlink(q) => Ok(q),
            r => Err(unexpected(r)),
        }
    }

    /// Tmknod.
    pub fn mknod(
        &mut self,
        dfid: u32,
        name: &[u8],
        mode: u32,
        major: u32,
        minor: u32,
        gid: u32,
    ) -> io::Result<Qid> {
        match self.rpc(&Tmessage::Mknod(Tmknod {
            dfid,
            name: name.to_vec(),
            mode,
            major,
            minor,
            gid,
        }))? {
            Rmessage::Mknod(q) => Ok(q),
            r => Err(unexpected(r)),
        }
    }

    /// Tlink.
    pub fn link(&mut self, dfid: u32, fid: u32, name: &[u8]) -> io::Result<()> {
        self.expect(
            Tmessage::Link(Tlink {
                dfid,
                fid,
                name: name.to_vec(),
            }),
            Rmessage::Link,
        )
    }

    /// Treadlink.
    pub fn readlink(&mut self, fid: u32) -> io::Result<Vec<u8>> {
        match self.rpc(&Tmessage::Readlink(Tfid { fid }))? {
            Rmessage::Readlink(t) => Ok(t),
            r => Err(unexpected(r)),
        }
    }

    /// Trename.
    pub fn rename(&mut self, fid: u32, dfid: u32, name: &[u8]) -> io::Result<()> {
        self.expect(
            Tmessage::Rename(Trename {
                fid,
                dfid,
                name: name.to_vec(),
            }),
            Rmessage::Rename,
        )
    }

    /// Trenameat.
    pub fn renameat(
        &mut self,
        olddirfid: u32,
        oldname: &[u8],
        newdirfid: u32,
        newname: &[u8],
    ) -> io::Result<()> {
        self.expect(
            Tmessage::Renameat(Trenameat {
                olddirfid,
                oldname: oldname.to_vec(),
                newdirfid,
                newname: newname.to_vec(),
            }),
            Rmessage::Renameat,
        )
    }

    /// Tunlinkat.
    pub fn unlinkat(&mut self, dirfid: u32, name: &[u8], flags: UnlinkFlags) -> io::Result<()> {
        self.expect(
            Tmessage::Unlinkat(Tunlinkat {
                dirfid,
                name: name.to_vec(),
                flags,
            }),
            Rmessage::Unlinkat,
        )
    }

    /// Txattrwalk; returns the value size.
    pub fn xattrwalk(&mut self, fid: u32, newfid: u32, name: &[u8]) -> io::Result<u64> {
        match self.rpc(&Tmessage::Xattrwalk(Txattrwalk {
            fid,
            newfid,
            name: name.to_vec(),
        }))? {
            Rmessage::Xattrwalk(n) => Ok(n),
            r => Err(unexpected(r)),
        }
    }

    /// Reads a whole xattr (or the name list for an empty name) through
    /// Txattrwalk + Tread + Tclunk on `tmpfid`.
    pub fn get_xattr(&mut self, fid: u32, tmpfid: u32, name: &[u8]) -> io::Result<Vec<u8>> {
        let size = self.xattrwalk(fid, tmpfid, name)?;
        let mut out = Vec::new();
        while (out.len() as u64) < size {
            let chunk = self.read(tmpfid, out.len() as u64, (size - out.len() as u64) as u32)?;
            if chunk.is_empty() {
                break;
            }
            out.extend(chunk);
        }
        self.clunk(tmpfid)?;
        Ok(out)
    }

    /// Txattrcreate.
    pub fn xattrcreate(
        &mut self,
        fid: u32,
        name: &[u8],
        attr_size: u64,
        flags: u32,
    ) -> io::Result<()> {
        self.expect(
            Tmessage::Xattrcreate(Txattrcreate {
                fid,
                name: name.to_vec(),
                attr_size,
                flags,
            }),
            Rmessage::Xattrcreate,
        )
    }

    /// Sets an xattr: walks `fid` to `tmpfid`, Txattrcreate, Twrite, Tclunk.
    pub fn set_xattr(
        &mut self,
        fid: u32,
        tmpfid: u32,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> io::Result<()> {
        self.walk(fid, tmpfid, &[])?;
        self.xattrcreate(tmpfid, name, value.len() as u64, flags)?;
        if !value.is_empty() {
            self.write(tmpfid, 0, value)?;
        }
        self.clunk(tmpfid)
    }

    /// Tlock; returns the status.
    pub fn lock(
        &mut self,
        fid: u32,
        ty: LockType,
        flags: LockFlags,
        start: u64,
        length: u64,
    ) -> io::Result<LockStatus> {
        match self.rpc(&Tmessage::Lock(Tlock {
            fid,
            ty,
            flags,
            start,
            length,
            proc_id: 1,
            client_id: b"client".to_vec(),
        }))? {
            Rmessage::Lock(s) => Ok(s),
            r => Err(unexpected(r)),
        }
    }

    /// Tgetlock.
    pub fn getlock(
        &mut self,
        fid: u32,
        ty: LockType,
        start: u64,
        length: u64,
    ) -> io::Result<Rgetlock> {
        match self.rpc(&Tmessage::Getlock(Tgetlock {
            fid,
            ty,
            start,
            length,
            proc_id: 1,
            client_id: b"client".to_vec(),
        }))? {
            Rmessage::Getlock(g) => Ok(g),
            r => Err(unexpected(r)),
        }
    }
}
