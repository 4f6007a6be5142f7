// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The 9P2000.L [`Server`]: decodes one request, runs it against a
//! [`Filesystem`] and encodes the reply.
//!
//! One request through the server: [`Server::handle`] reads the header from
//! the [`RequestReader`], checks the size against the session's msize, then
//! either takes the Twrite zero-copy path (the data stays in the request
//! buffers until `pwritev`) or reads the body and decodes it strictly
//! ([`Tmessage::decode_body`]). The operation runs through the caller's
//! [`Blocking`] executor. Rread data goes from `preadv` straight into the
//! reply ([`ReplyWriter::split_at`] leaves room for the header); every other
//! reply is encoded and written at once.
//!
//! # Engines, concurrency and Tflush
//!
//! A `Server` is `Sync` and a [`Session`] is `Sync`: an engine may run many
//! requests of one session at once (fids are reference counted, so a Tclunk
//! during a Tread is safe). The server answers Tflush with Rflush at once,
//! which is right for an engine that runs requests one after another. An
//! engine that keeps requests in flight handles Tflush itself: it parses
//! the header ([`Header::from_bytes`]) and `oldtag` from a copy of the
//! request, cancels the old request's [`Cancel`] token, waits until that
//! request has finished (the only server operation that waits on a token is
//! a blocking Tlock, which then answers EINTR), drops the old reply, and
//! only then sends Rflush, as the protocol requires.

mod errno;
mod session;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{debug, error};

use crate::error::{Error, Result};
use crate::fs::{validate_name, validate_walk_name, Cred, Filesystem};
use crate::io::{ReplyWriter, RequestReader};
use crate::protocol::*;

pub(crate) use session::try_add;
pub use session::Session;
use session::{Fid, FidKind, Limits, Usage, XattrWrite};

/// Default limit on fids per session.
pub const DEFAULT_MAX_FIDS: usize = 65_536;
/// Default limit on fids of all sessions of one server together.
pub const DEFAULT_MAX_TOTAL_FIDS: usize = 262_144;
/// Default limit on bytes held by the xattr fids of one session.
pub const DEFAULT_MAX_XATTR_BYTES: usize = 4 << 20;
/// Default limit on bytes held by the xattr fids of all sessions.
pub const DEFAULT_MAX_TOTAL_XATTR_BYTES: usize = 64 << 20;
/// Largest xattr value or name list served or accepted (Linux's
/// `XATTR_SIZE_MAX`).
pub const MAX_XATTR_SIZE: usize = 65_536;
/// Longest xattr name (Linux's `XATTR_NAME_MAX`).
pub const MAX_XATTR_NAME: usize = 255;
/// How long a blocking Tlock waits by default before answering `BLOCKED`
/// (the Linux client then retries).
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(1);
/// The size of an Rlerror and of an Rread header: `size type tag u32`.
const RHDR_COUNT: usize = HEADER_SIZE + 4;
/// Largest reply-encoding buffer kept per thread between replies.
const ENCODE_BUF_KEEP: usize = 64 << 10;

thread_local! {
    static ENCODE_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Encodes `msg` as a whole frame into `out` (cleared first).
fn encode_reply(out: &mut Vec<u8>, msg: &Rmessage, tag: u16) {
    out.clear();
    out.extend_from_slice(&[0; HEADER_SIZE]);
    msg.encode_body(out);
    let hdr = Header {
        size: out.len() as u32,
        ty: msg.msg_type().into(),
        tag,
    };
    out[..HEADER_SIZE].copy_from_slice(&hdr.to_bytes());
}

/// Request bodies up to this size are decoded from a stack buffer.
const SMALL_BODY: usize = 512;
/// The uid of fids attached without a numeric user.
const NOBODY: u32 = 65_534;
/// Tattach/Tauth `n_uname` meaning "no numeric user given".
const NONUNAME: u32 = u32::MAX;

/// Server limits. Every limit is named; see the field docs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// Largest msize granted in Rversion, `MIN_MSIZE..=MAX_MSIZE`.
    pub msize_max: u32,
    /// Most fids one session may hold; more fail with `EMFILE`.
    pub max_fids: usize,
    /// Most fids all sessions of this server may hold together; more fail
    /// with `ENFILE`.
    pub max_total_fids: usize,
    /// Most bytes the xattr fids (Txattrwalk values, Txattrcreate buffers)
    /// of one session may hold; more fail with `ENOMEM`.
    pub max_xattr_bytes: usize,
    /// Most bytes the xattr fids of all sessions may hold together; more
    /// fail with `ENOMEM`.
    pub max_total_xattr_bytes: usize,
    /// Largest xattr value or list, at most [`MAX_XATTR_SIZE`]; larger
    /// ones fail with `E2BIG`.
    pub max_xattr_size: usize,
    /// How long a blocking Tlock (`FLAGS_BLOCK`) waits for the lock before
    /// answering `BLOCKED`; `None` waits until granted or cancelled.
    pub lock_wait: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            msize_max: MAX_MSIZE,
            max_fids: DEFAULT_MAX_FIDS,
            max_total_fids: DEFAULT_MAX_TOTAL_FIDS,
            max_xattr_bytes: DEFAULT_MAX_XATTR_BYTES,
            max_total_xattr_bytes: DEFAULT_MAX_TOTAL_XATTR_BYTES,
            max_xattr_size: MAX_XATTR_SIZE,
            lock_wait: Some(DEFAULT_LOCK_WAIT),
        }
    }
}

/// Runs potentially blocking filesystem calls. An engine on coroutines
/// implements it to hand `f` to a worker thread and yield until it is done;
/// [`Inline`] just calls it.
///
/// `op` is the request's message type (for example [`MsgType::Tread`]), so an
/// engine can run cheap requests inline and offload the rest. The closure
/// borrows the filesystem, the fid and, for Tread/Twrite, the request
/// reader or reply writer; hence [`Server::handle`] needs them to be `Send`.
pub trait Blocking {
    /// Runs `f` to completion and returns its result. An executor that
    /// cancels the request before `f` started returns
    /// [`Interrupted::interrupted`] instead (the request then answers
    /// EINTR and finishes normally; nothing is unwound).
    fn run<R: Interrupted + Send>(&self, op: MsgType, f: impl FnOnce() -> R + Send) -> R;

    /// Waits `d` between the attempts of a blocking Tlock. The default
    /// sleeps the thread; a coroutine engine yields to a timer instead, so
    /// a waiting lock holds no thread.
    fn sleep(&self, d: Duration) {
        std::thread::sleep(d);
    }
}

/// The result of a call that was cancelled before it ran (Tflush, reset):
/// an EINTR error.
pub trait Interrupted {
    /// The value standing in for the call's result.
    fn interrupted() -> Self;
}

impl<T> Interrupted for std::io::Result<T> {
    fn interrupted() -> Self {
        Err(std::io::Error::from_raw_os_error(libc::EINTR))
    }
}

impl<T> Interrupted for std::result::Result<T, u32> {
    fn interrupted() -> Self {
        Err(errno::EINTR)
    }
}

/// Runs every call on the calling thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct Inline;

impl Blocking for Inline {
    fn run<R: Send>(&self, _op: MsgType, f: impl FnOnce() -> R + Send) -> R {
        f()
    }
}

/// Cancellation flag of one request (set by an engine on Tflush).
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// A token that is not cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels the request.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`Cancel::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// What [`Server::handle`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// The request's tag.
    pub tag: u16,
    /// The request's type.
    pub request_type: u8,
    /// The reply's type ([`MsgType::Rlerror`] for errors).
    pub reply_type: u8,
    /// Bytes of the reply, the `size` field.
    pub size: u32,
}

/// A 9P2000.L server over a [`Filesystem`].
#[derive(Debug)]
pub struct Server<F> {
    fs: F,
    config: Config,
    usage: Usage,
}

type OpResult = std::result::Result<Rmessage, u32>;

impl<F: Filesystem> Server<F> {
    /// A server for `fs`. Fails if `config.msize_max` is out of range.
    pub fn new(fs: F, mut config: Config) -> Result<Self> {
        if !(MIN_MSIZE..=MAX_MSIZE).contains(&config.msize_max) {
            return Err(Error::InvalidMsize(config.msize_max));
        }
        config.max_xattr_size = config.max_xattr_size.min(MAX_XATTR_SIZE);
        Ok(Server {
            fs,
            config,
            usage: Usage::default(),
        })
    }

    /// Fids held by all sessions of this server.
    pub fn total_fids(&self) -> usize {
        self.usage.fids.load(Ordering::Acquire)
    }

    /// Bytes held by the xattr fids of all sessions of this server.
    pub fn total_xattr_bytes(&self) -> usize {
        self.usage.xattr_bytes.load(Ordering::Acquire)
    }

    fn limits(&self) -> Limits<'_> {
        Limits {
            usage: &self.usage,
            max_fids: self.config.max_fids,
            max_total_fids: self.config.max_total_fids,
            max_xattr_bytes: self.config.max_xattr_bytes,
            max_total_xattr_bytes: self.config.max_total_xattr_bytes,
        }
    }

    /// The filesystem.
    pub fn filesystem(&self) -> &F {
        &self.fs
    }

    /// The limits.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Handles one request. The reader holds exactly one message (bytes
    /// beyond its `size` are ignored); the reply is written to `reply`.
    ///
    /// Malformed requests get an Rlerror. `Err` means nothing useful could
    /// be answered: fewer than 7 request bytes, a reply buffer smaller than
    /// an Rlerror (11 bytes), or a transport I/O error.
    pub fn handle<R, W, B>(
        &self,
        session: &Session<F>,
        req: &mut R,
        reply: &mut W,
        exec: &B,
        cancel: &Cancel,
    ) -> Result<Reply>
    where
        R: RequestReader + Send,
        W: ReplyWriter + Send,
        B: Blocking,
    {
        if reply.available_bytes() < RHDR_COUNT {
            return Err(Error::ReplyTooSmall(reply.available_bytes()));
        }
        let avail = req.available_bytes();
        if avail < HEADER_SIZE {
            return Err(Error::ShortRequest(avail));
        }
        let mut hdr = [0u8; HEADER_SIZE];
        req.read_exact(&mut hdr).map_err(Error::Transport)?;
        let h = Header::from_bytes(&hdr);
        // One msize snapshot per request, used for every check and every
        // use below: a concurrent Tversion of the same session may change
        // the session's msize at any time (even to 0).
        let msize = session.msize();
        let frame_limit = if msize == 0 { MIN_MSIZE } else { msize };
        let fail = |reply: &mut W, e: DecodeError| {
            error!("9p: malformed request (type {}, tag {}): {e}", h.ty, h.tag);
            self.send(reply, &h, Err(e.errno()), frame_limit)
        };
        let limit = if h.ty == TVERSION {
            self.config.msize_max
        } else {
            frame_limit
        };
        if let Err(e) = h.check_size(limit) {
            return fail(reply, e);
        }
        let body_len = h.size as usize - HEADER_SIZE;
        if avail - HEADER_SIZE < body_len {
            return fail(
                reply,
                DecodeError::SizeMismatch {
                    declared: h.size,
                    actual: avail,
                },
            );
        }
        if msize == 0 && h.ty != TVERSION {
            error!("9p: request type {} before Tversion", h.ty);
            return self.send(reply, &h, Err(errno::EPROTO), MIN_MSIZE);
        }
        if h.ty == TWRITE {
            return self.write(session, &h, req, reply, exec, msize);
        }
        // Most bodies are small: read them onto the stack.
        let mut small = [0u8; SMALL_BODY];
        let mut large = Vec::new();
        let body: &mut [u8] = if body_len <= SMALL_BODY {
            &mut small[..body_len]
        } else {
            large.resize(body_len, 0);
            &mut large
        };
        req.read_exact(body).map_err(Error::Transport)?;
        let msg = match Tmessage::decode_body(h.ty, body) {
            Ok(m) => m,
            Err(e) => return fail(reply, e),
        };
        // The decoded message owns what it needs (names are at most
        // MAX_NAME_LEN bytes): free the raw body before the request waits
        // for a worker.
        drop(large);
        debug!("9p: tag {} {:?}", h.tag, msg);
        let result = match msg {
            Tmessage::Version(m) => {
                let out = self.version(session, &m);
                return self.send(reply, &h, Ok(out), MAX_MSIZE);
            }
            Tmessage::Read(m) => return self.read(session, &h, &m, reply, exec, msize),
            Tmessage::Auth(_) => Err(errno::EOPNOTSUPP),
            Tmessage::Flush(_) => Ok(Rmessage::Flush),
            Tmessage::Attach(m) => self.attach(session, &m, exec),
            Tmessage::Walk(m) => self.walk(session, m, exec),
            Tmessage::Write(_) => unreachable_write(),
            Tmessage::Clunk(m) => self.clunk(session, m.fid, exec),
            Tmessage::Remove(m) => self.remove(session, m.fid, exec),
            Tmessage::Statfs(m) => self.with_inode(session, m.fid, exec, TSTATFS, |fs, f| {
                fs.statfs(&f.inode).map(Rmessage::Statfs)
            }),
            Tmessage::Lopen(m) => self.lopen(session, &m, exec),
            Tmessage::Lcreate(m) => self.lcreate(session, &m, exec),
            Tmessage::Symlink(m) => {
                self.create_entry(session, m.fid, &m.name, exec, TSYMLINK, |fs, f| {
                    let cred = Cred {
                        uid: f.uid,
                        gid: m.gid,
                    };
                    fs.symlink(&f.inode, &m.name, &m.symtgt, cred)
                        .map(Rmessage::Symlink)
                })
            }
            Tmessage::Mknod(m) => {
                self.create_entry(session, m.dfid, &m.name, exec, TMKNOD, |fs, f| {
                    let cred = Cred {
                        uid: f.uid,
                        gid: m.gid,
                    };
                    let rdev = libc::makedev(m.major, m.minor);
                    fs.mknod(&f.inode, &m.name, m.mode, rdev, cred)
                        .map(Rmessage::Mknod)
                })
            }
            Tmessage::Mkdir(m) => {
                self.create_entry(session, m.dfid, &m.name, exec, TMKDIR, |fs, f| {
                    let cred = Cred {
                        uid: f.uid,
                        gid: m.gid,
                    };
                    fs.mkdir(&f.inode, &m.name, m.mode, cred)
                        .map(Rmessage::Mkdir)
                })
            }
            Tmessage::Rename(m) => self.rename(session, &m, exec),
            Tmessage::Readlink(m) => self.with_inode(session, m.fid, exec, TREADLINK, |fs, f| {
                fs.readlink(&f.inode).map(Rmessage::Readlink)
            }),
            Tmessage::Getattr(m) => self.with_inode(session, m.fid, exec, TGETATTR, |fs, f| {
                fs.getattr(&f.inode, m.request_mask)
                    .map(|a| Rmessage::Getattr(Box::new(a)))
            }),
            Tmessage::Setattr(m) => self.with_inode(session, m.fid, exec, TSETATTR, |fs, f| {
                let file = match &f.kind {
                    FidKind::Open { file } => Some(file),
                    _ => None,
                };
                fs.setattr(&f.inode, file, &m).map(|_| Rmessage::Setattr)
            }),
            Tmessage::Xattrwalk(m) => self.xattrwalk(session, &m, exec),
            Tmessage::Xattrcreate(m) => self.xattrcreate(session, m),
            Tmessage::Readdir(m) => self.readdir(session, &m, reply.available_bytes(), msize, exec),
            Tmessage::Fsync(m) => self.with_file(session, m.fid, exec, TFSYNC, |fs, file| {
                fs.fsync(file, m.datasync != 0).map(|_| Rmessage::Fsync)
            }),
            Tmessage::Lock(m) => self.lock(session, &m, exec, cancel),
            Tmessage::Getlock(m) => self.with_file(session, m.fid, exec, TGETLOCK, |fs, file| {
                fs.getlock(file, &m).map(Rmessage::Getlock)
            }),
            Tmessage::Link(m) => self.link(session, &m, exec),
            Tmessage::Renameat(m) => self.renameat(session, &m, exec),
            Tmessage::Unlinkat(m) => {
                self.create_entry(session, m.dirfid, &m.name, exec, TUNLINKAT, |fs, f| {
                    if !(m.flags - UnlinkFlags::REMOVEDIR).is_empty() {
                        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
                    }
                    fs.unlinkat(&f.inode, &m.name, m.flags)
                        .map(|_| Rmessage::Unlinkat)
                })
            }
        };
        self.send(reply, &h, result, msize)
    }

    /// Encodes and writes a reply, replacing it by Rlerror(EMSGSIZE) if it
    /// does not fit the msize or the buffer.
    fn send<W: ReplyWriter>(
        &self,
        reply: &mut W,
        h: &Header,
        result: OpResult,
        msize: u32,
    ) -> Result<Reply> {
        let msg = match result {
            Ok(m) => m,
            Err(e) => {
                debug!("9p: tag {} -> Rlerror {e}", h.tag);
                Rmessage::Lerror(e)
            }
        };
        // Encode into a per-thread buffer: no allocation per reply.
        ENCODE_BUF.with(|buf| {
            let mut frame = buf.borrow_mut();
            encode_reply(&mut frame, &msg, h.tag);
            if frame.len() > reply.available_bytes() || frame.len() > msize as usize {
                error!(
                    "9p: reply of {} bytes to tag {} does not fit (msize {msize}, buffer {})",
                    frame.len(),
                    h.tag,
                    reply.available_bytes()
                );
                encode_reply(&mut frame, &Rmessage::Lerror(errno::EMSGSIZE), h.tag);
            }
            reply.write_all(&frame).map_err(Error::Transport)?;
            let out = Reply {
                tag: h.tag,
                request_type: h.ty,
                reply_type: frame[4],
                size: frame.len() as u32,
            };
            if frame.capacity() > ENCODE_BUF_KEEP {
                *frame = Vec::new();
            }
            Ok(out)
        })
    }

    fn version(&self, session: &Session<F>, m: &Tversion) -> Rmessage {
        let msize = m.msize.min(self.config.msize_max);
        if msize < MIN_MSIZE {
            error!(
                "9p: client msize {} is below the minimum {MIN_MSIZE}",
                m.msize
            );
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

    fn attach<B: Blocking>(&self, session: &Session<F>, m: &Tattach, exec: &B) -> OpResult {
        if m.afid != NOFID {
            return Err(errno::EINVAL);
        }
        let uid = if m.n_uname == NONUNAME {
            NOBODY
        } else {
            m.n_uname
        };
        let (inode, qid) = exec
            .run(TATTACH, || self.fs.attach(&m.aname, Cred { uid, gid: uid }))
            .map_err(|e| errno::from_io(&e))?;
        let fid = Fid {
            inode,
            uid,
            kind: FidKind::Path,
        };
        session.insert_new(m.fid, fid, &self.limits())?;
        Ok(Rmessage::Attach(qid))
    }

    fn walk<B: Blocking>(&self, session: &Session<F>, m: Twalk, exec: &B) -> OpResult {
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
        let (inode, qids) = exec.run(TWALK, || {
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

    fn clunk<B: Blocking>(&self, session: &Session<F>, fid: u32, exec: &B) -> OpResult {
        let fid = session.remove(fid)?;
        if let FidKind::XattrWrite(w) = &fid.kind {
            let w = w.lock().unwrap_or_else(|e| e.into_inner());
            if w.data.len() != w.size {
                return Err(errno::EINVAL);
            }
            exec.run(TCLUNK, || {
                if w.size == 0 && w.flags == libc::XATTR_REPLACE as u32 {
                    self.fs.removexattr(&fid.inode, &w.name)
                } else {
                    self.fs.setxattr(&fid.inode, &w.name, &w.data, w.flags)
                }
            })
            .map_err(|e| errno::from_io(&e))?;
        }
        Ok(Rmessage::Clunk)
    }

    fn remove<B: Blocking>(&self, session: &Session<F>, fid: u32, exec: &B) -> OpResult {
        // Tremove clunks the fid even when the removal fails.
        let fid = session.remove(fid)?;
        exec.run(TREMOVE, || self.fs.remove(&fid.inode))
            .map_err(|e| errno::from_io(&e))?;
        Ok(Rmessage::Remove)
    }

    /// Runs `op` on the fid's inode.
    fn with_inode<B: Blocking>(
        &self,
        session: &Session<F>,
        fid: u32,
        exec: &B,
        op: MsgType,
        f: impl FnOnce(&F, &Fid<F>) -> std::io::Result<Rmessage> + Send,
    ) -> OpResult {
        let fid = session.get(fid)?;
        exec.run(op, || f(&self.fs, &fid))
            .map_err(|e| errno::from_io(&e))
    }

    /// Runs `op` on the fid's open file (EBADF if it is not open).
    fn with_file<B: Blocking>(
        &self,
        session: &Session<F>,
        fid: u32,
        exec: &B,
        op: MsgType,
        f: impl FnOnce(&F, &F::File) -> std::io::Result<Rmessage> + Send,
    ) -> OpResult {
        let fid = session.get(fid)?;
        let FidKind::Open { file } = &fid.kind else {
            return Err(errno::EBADF);
        };
        exec.run(op, || f(&self.fs, file))
            .map_err(|e| errno::from_io(&e))
    }

    /// Validates `name`, then runs `op` on directory fid `dfid`.
    fn create_entry<B: Blocking>(
        &self,
        session: &Session<F>,
        dfid: u32,
        name: &[u8],
        exec: &B,
        op: MsgType,
        f: impl FnOnce(&F, &Fid<F>) -> std::io::Result<Rmessage> + Send,
    ) -> OpResult {
        validate_name(name).map_err(|e| errno::from_io(&e))?;
        self.with_inode(session, dfid, exec, op, f)
    }

    fn lopen<B: Blocking>(&self, session: &Session<F>, m: &Tlopen, exec: &B) -> OpResult {
        let fid = session.get(m.fid)?;
        if !matches!(fid.kind, FidKind::Path) {
            return Err(errno::EBADF);
        }
        let (file, qid) = exec
            .run(TLOPEN, || self.fs.open(&fid.inode, m.flags))
            .map_err(|e| errno::from_io(&e))?;
        let entry = Fid {
            inode: fid.inode.clone(),
            uid: fid.uid,
            kind: FidKind::Open { file },
        };
        session.replace_if(m.fid, &fid, entry)?;
        Ok(Rmessage::Lopen(qid, 0))
    }

    fn lcreate<B: Blocking>(&self, session: &Session<F>, m: &Tlcreate, exec: &B) -> OpResult {
        validate_name(&m.name).map_err(|e| errno::from_io(&e))?;
        let fid = session.get(m.fid)?;
        if !matches!(fid.kind, FidKind::Path) {
            return Err(errno::EBADF);
        }
        let cred = Cred {
            uid: fid.uid,
            gid: m.gid,
        };
        let (inode, file, qid) = exec
            .run(TLCREATE, || {
                self.fs.create(&fid.inode, &m.name, m.flags, m.mode, cred)
            })
            .map_err(|e| errno::from_io(&e))?;
        let entry = Fid {
            inode,
            uid: fid.uid,
            kind: FidKind::Open { file },
        };
        session.replace_if(m.fid, &fid, entry)?;
        Ok(Rmessage::Lcreate(qid, 0))
    }

    fn rename<B: Blocking>(&self, session: &Session<F>, m: &Trename, exec: &B) -> OpResult {
        validate_name(&m.name).map_err(|e| errno::from_io(&e))?;
        let fid = session.get(m.fid)?;
        let dir = session.get(m.dfid)?;
        exec.run(TRENAME, || self.fs.rename(&fid.inode, &dir.inode, &m.name))
            .map_err(|e| errno::from_io(&e))?;
        Ok(Rmessage::Rename)
    }

    fn link<B: Blocking>(&self, session: &Session<F>, m: &Tlink, exec: &B) -> OpResult {
        validate_name(&m.name).map_err(|e| errno::from_io(&e))?;
        let dir = session.get(m.dfid)?;
        let target = session.get(m.fid)?;
        exec.run(TLINK, || self.fs.link(&target.inode, &dir.inode, &m.name))
            .map_err(|e| errno::from_io(&e))?;
        Ok(Rmessage::Link)
    }

    fn renameat<B: Blocking>(&self, session: &Session<F>, m: &Trenameat, exec: &B) -> OpResult {
        validate_name(&m.oldname).map_err(|e| errno::from_io(&e))?;
        validate_name(&m.newname).map_err(|e| errno::from_io(&e))?;
        let old = session.get(m.olddirfid)?;
        let new = session.get(m.newdirfid)?;
        exec.run(TRENAMEAT, || {
            self.fs
                .renameat(&old.inode, &m.oldname, &new.inode, &m.newname)
        })
        .map_err(|e| errno::from_io(&e))?;
        Ok(Rmessage::Renameat)
    }

    fn xattrwalk<B: Blocking>(&self, session: &Session<F>, m: &Txattrwalk, exec: &B) -> OpResult {
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
        let value = exec
            .run(TXATTRWALK, || {
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

    fn xattrcreate(&self, session: &Session<F>, m: Txattrcreate) -> OpResult {
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
            kind: FidKind::XattrWrite(std::sync::Mutex::new(XattrWrite {
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

    fn readdir<B: Blocking>(
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
        self.with_file(session, m.fid, exec, TREADDIR, |fs, file| {
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

    fn lock<B: Blocking>(
        &self,
        session: &Session<F>,
        m: &Tlock,
        exec: &B,
        cancel: &Cancel,
    ) -> OpResult {
        // The lock type was checked at decode (EINVAL).
        let wait = m.flags.contains(LockFlags::BLOCK) && m.ty != LockType::Unlck;
        let lock_wait = self.config.lock_wait;
        let fid = session.get(m.fid)?;
        let FidKind::Open { file } = &fid.kind else {
            return Err(errno::EBADF);
        };
        let start = Instant::now();
        let mut pause = Duration::from_micros(500);
        loop {
            // One attempt per call: between attempts the request waits in
            // `exec.sleep`, which holds no worker on a coroutine engine.
            let status = exec
                .run(TLOCK, || self.fs.try_lock(file, m))
                .map_err(|e| errno::from_io(&e))?;
            if status != LockStatus::Blocked || !wait {
                return Ok(Rmessage::Lock(status));
            }
            if cancel.is_cancelled() {
                return Err(errno::EINTR);
            }
            if lock_wait.is_some_and(|w| start.elapsed() >= w) {
                return Ok(Rmessage::Lock(LockStatus::Blocked));
            }
            exec.sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    fn read<W: ReplyWriter + Send, B: Blocking>(
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
            FidKind::Open { file } => {
                let mut data = reply.split_at(RHDR_COUNT).map_err(Error::Transport)?;
                exec.run(TREAD, || self.fs.read(file, &mut data, count, m.offset))
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

    fn write<R: RequestReader + Send, W: ReplyWriter, B: Blocking>(
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
            error!("9p: malformed Twrite (tag {}): {e}", h.tag);
            return self.send(reply, h, Err(e.errno()), msize);
        }
        let mut raw = [0u8; TwriteHeader::SIZE];
        req.read_exact(&mut raw).map_err(Error::Transport)?;
        let m = match TwriteHeader::decode(&raw, body_len - TwriteHeader::SIZE) {
            Ok(m) => m,
            Err(e) => {
                error!("9p: malformed Twrite (tag {}): {e}", h.tag);
                return self.send(reply, h, Err(e.errno()), msize);
            }
        };
        debug!("9p: tag {} {:?}", h.tag, m);
        let count = m.count as usize;
        let result = match session.get(m.fid) {
            Err(e) => Err(e),
            Ok(fid) => match &fid.kind {
                FidKind::Open { file } => exec
                    .run(TWRITE, || self.fs.write(file, req, count, m.offset))
                    .map(|n| Rmessage::Write(n as u32))
                    .map_err(|e| errno::from_io(&e)),
                FidKind::XattrWrite(w) => {
                    let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
                    if m.offset != w.data.len() as u64 || w.data.len() + count > w.size {
                        Err(errno::EINVAL)
                    } else {
                        let old = w.data.len();
                        // Exactly the declared size: what the charge covers.
                        let want = w.size - old;
                        w.data.reserve_exact(want);
                        w.data.resize(old + count, 0);
                        match req.read_exact(&mut w.data[old..]) {
                            Ok(()) => Ok(Rmessage::Write(m.count)),
                            Err(e) => {
                                w.data.truncate(old);
                                return Err(Error::Transport(e));
                            }
                        }
                    }
                }
                _ => Err(errno::EBADF),
            },
        };
        self.send(reply, h, result, msize)
    }
}

/// Twrite never reaches the generic decoder path of [`Server::handle`]: it
/// is dispatched to the zero-copy path first.
fn unreachable_write() -> OpResult {
    Err(errno::EPROTO)
}
