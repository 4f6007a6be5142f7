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
//! # Where each step lives
//!
//! `mod.rs` holds [`Config`], [`Server::handle`] (header and size checks,
//! body decode, then a plain dispatch) and the reply encoder; each
//! operation is in the file of its area: `attach_walk` (Tversion, Tattach,
//! Twalk, Tclunk), `open_create` (Tlopen, Tlcreate, Tmkdir, Tsymlink,
//! Tmknod), `read_write` (Tread, Twrite, Tfsync), `dir` (Treaddir), `attr`
//! (Tgetattr, Tsetattr, Tstatfs, Treadlink), `xattr` (Txattrwalk,
//! Txattrcreate and its commit), `lock` (Tlock, Tgetlock), `link_rename`
//! (Tlink, Trename, Trenameat, Tunlinkat, Tremove). `session` is the fid
//! table, `log_limit` the
//! per-server limit on guest-triggered log lines
//! ([`Config::guest_log_lines_per_sec`]). The executor hook and cancel
//! token the server runs with are in `exec.rs`; saving, journaling and
//! recovering a session are in `crate::persist`.
//!
//! # Engines, concurrency and Tflush
//!
//! A `Server` is `Sync` and a [`Session`] is `Sync`: an engine may run many
//! requests of one session at once (fids are reference counted, so a Tclunk
//! during a Tread is safe). The server answers Tflush with Rflush (encoded
//! by the protocol codec) after [`Blocking::flush`] returns: at once for [`Inline`](crate::Inline), which runs
//! requests one after another; once the old request has finished for the
//! coroutine engine, which owns Tflush for every transport
//! ([`crate::engine`], "Tflush").

// One file per step of the request path: `handle` below decodes and
// dispatches; each operation lives in the file of its area.
mod attach_walk;
mod attr;
mod dir;
pub(crate) mod errno;
mod keeper;
mod link_rename;
mod lock;
mod log_limit;
mod open_create;
mod read_write;
pub(crate) mod session;
mod xattr;

use std::sync::atomic::Ordering;
use std::time::Duration;

use log::{debug, warn};

use crate::error::{Error, Result};
use crate::exec::CallHint;
use crate::fs::{validate_name, Filesystem};
use crate::io::{ReplyWriter, RequestReader};
use crate::persist::inflight_table::RequestRecord;
use crate::protocol::*;

pub use crate::exec::{Blocking, Cancel, Interrupted};
pub use keeper::LockKeeper;
pub(crate) use log_limit::LogLimit;
use log_limit::DEFAULT_GUEST_LOG_LINES_PER_SEC;
pub(crate) use session::try_add;
pub use session::Session;
use session::{Fid, FidKind, Limits, Usage};

/// Default limit on fids per session (walked fids share the bounded
/// cache of path fds; open ones are bounded by `Config::max_open_fids`).
pub const DEFAULT_MAX_FIDS: usize = 65_536;
/// Default limit on open fids per session ([`Config::default`]): each
/// holds a host fd, so an embedding process keeps most of its own.
const EMBEDDED_MAX_OPEN_FIDS: usize = 256;
/// Fds an embedding process keeps for itself in
/// [`Config::sized_to_process`].
const PROCESS_RESERVED_FDS: u64 = 256;
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
/// Default limit on blocking Tlocks of one session waiting in the server
/// at once; past it a blocking Tlock that finds the lock taken answers
/// `BLOCKED` at once (the Linux client then retries after its
/// `locktimeout`).
pub const DEFAULT_MAX_LOCK_WAITERS: usize = 128;
/// The size of an Rlerror and of an Rread header: `size type tag u32`.
const RHDR_COUNT: usize = HEADER_SIZE + 4;
/// Largest reply-encoding buffer kept per thread between replies.
const ENCODE_BUF_KEEP: usize = 64 << 10;

thread_local! {
    static ENCODE_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Encodes `msg` as a whole frame into `out` (cleared first).
fn encode_reply(out: &mut Vec<u8>, msg: &Rmessage, tag: u16) {
    encode_frame(out, msg.msg_type(), tag, |out| msg.encode_body(out));
}

/// Encodes a whole frame of type `ty` into `out` (cleared first), its body
/// appended by `body`.
fn encode_frame(out: &mut Vec<u8>, ty: MsgType, tag: u16, body: impl FnOnce(&mut Vec<u8>)) {
    out.clear();
    out.extend_from_slice(&[0; HEADER_SIZE]);
    body(out);
    let hdr = Header {
        size: out.len() as u32,
        ty: ty.into(),
        tag,
    };
    out[..HEADER_SIZE].copy_from_slice(&hdr.to_bytes());
}

/// Request bodies up to this size are decoded from a stack buffer.
const SMALL_BODY: usize = 512;
/// Request bodies up to this size are decoded from a smaller one.
const TINY_BODY: usize = 32;
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
    /// Most fids one session may hold open (Tlopen, Tlcreate); more fail
    /// with `EMFILE`. Each open fid holds a host fd, while walked fids
    /// share a bounded cache of them
    /// ([`PassthroughConfig::max_path_fds`](crate::PassthroughConfig::max_path_fds)),
    /// so this is the limit that divides a process's fds between
    /// sessions. Default: 256 ([`Config::sized_to_process`]: half the
    /// process's fds).
    pub max_open_fids: usize,
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
    /// answering `BLOCKED`. `None` (the default) waits until the lock is
    /// granted, the request is flushed, the device is handed over
    /// ([`Cancel::end_waits`]) or the session ends (a pause of the device
    /// keeps it waiting, see [`Cancel::hold_waits`]): the Linux client
    /// sleeps its `locktimeout` (30 s) after every `BLOCKED`, so waiting
    /// here is what makes a released lock reach a waiting guest at once.
    /// With the [`Inline`](crate::Inline) executor a waiting Tlock holds the calling
    /// thread: bound it there.
    pub lock_wait: Option<Duration>,
    /// Most blocking Tlocks of one session that wait in the server at once
    /// (each holds a request slot); past it, `BLOCKED` at once.
    pub max_lock_waiters: usize,
    /// Most guest-triggered log lines (malformed requests, replies that do
    /// not fit, refused connections) per second; the rest are counted and
    /// reported as one "suppressed" line (default 10).
    pub guest_log_lines_per_sec: u32,
    /// Where the file descriptions holding granted locks are kept while
    /// they hold them, so that a crash of this process (`kill -9`) does
    /// not release the guest's locks, and where a restored session takes
    /// them back from ([`LockKeeper`]). `None` (the default): a restored
    /// session takes its locks again, and a host process may take one in
    /// the gap between the crash and the restore (logged).
    pub lock_keeper: Option<std::sync::Arc<dyn LockKeeper>>,
}

/// Bounded for a server embedded in a VMM's process: at most 256 open
/// fids (host fds) per session; see "Limits" in the README.
impl Default for Config {
    fn default() -> Self {
        Config {
            msize_max: MAX_MSIZE,
            max_fids: DEFAULT_MAX_FIDS,
            max_total_fids: DEFAULT_MAX_TOTAL_FIDS,
            max_open_fids: EMBEDDED_MAX_OPEN_FIDS,
            max_xattr_bytes: DEFAULT_MAX_XATTR_BYTES,
            max_total_xattr_bytes: DEFAULT_MAX_TOTAL_XATTR_BYTES,
            max_xattr_size: MAX_XATTR_SIZE,
            lock_wait: None,
            max_lock_waiters: DEFAULT_MAX_LOCK_WAITERS,
            guest_log_lines_per_sec: DEFAULT_GUEST_LOG_LINES_PER_SEC,
            lock_keeper: None,
        }
    }
}

impl Config {
    /// Sized from the process's soft `RLIMIT_NOFILE`, for a process that
    /// serves one session and little else (the daemon's sizing): open
    /// fids up to half of what is left after 256 fds for the process,
    /// at most [`DEFAULT_MAX_FIDS`] and at least the embedded default.
    pub fn sized_to_process() -> Self {
        let half = crate::sys::soft_nofile().saturating_sub(PROCESS_RESERVED_FDS) / 2;
        Config {
            max_open_fids: usize::try_from(half)
                .unwrap_or(usize::MAX)
                .clamp(EMBEDDED_MAX_OPEN_FIDS, DEFAULT_MAX_FIDS),
            ..Config::default()
        }
    }
}

/// Whether the reply of a request of type `ty` is recorded for exactly
/// once across a crash (`persist::exactly_once`): the requests that change
/// fids or the export.
pub(crate) fn records_reply(ty: u8) -> bool {
    [
        MsgType::Twalk,
        MsgType::Tattach,
        MsgType::Txattrwalk,
        MsgType::Tlopen,
        MsgType::Tlcreate,
        MsgType::Txattrcreate,
        MsgType::Tclunk,
        MsgType::Tremove,
        MsgType::Tmkdir,
        MsgType::Tsymlink,
        MsgType::Tmknod,
        MsgType::Tlink,
        MsgType::Tunlinkat,
        MsgType::Trenameat,
        MsgType::Trename,
        MsgType::Tsetattr,
    ]
    .iter()
    .any(|t| u8::from(*t) == ty)
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
    // Read by the restart code in `crate::persist` too.
    pub(crate) fs: F,
    pub(crate) config: Config,
    usage: Usage,
    /// The limit on guest-triggered log lines.
    log: LogLimit,
}

pub(crate) type OpResult = std::result::Result<Rmessage, u32>;

impl<F: Filesystem> Server<F> {
    /// A server for `fs`. Fails if `config.msize_max` is out of range.
    pub fn new(fs: F, mut config: Config) -> Result<Self> {
        if !(MIN_MSIZE..=MAX_MSIZE).contains(&config.msize_max) {
            return Err(Error::InvalidMsize(config.msize_max));
        }
        config.max_xattr_size = config.max_xattr_size.min(MAX_XATTR_SIZE);
        Ok(Server {
            fs,
            log: LogLimit::new(config.guest_log_lines_per_sec),
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

    pub(crate) fn limits(&self) -> Limits<'_> {
        Limits {
            usage: &self.usage,
            max_fids: self.config.max_fids,
            max_total_fids: self.config.max_total_fids,
            max_xattr_bytes: self.config.max_xattr_bytes,
            max_total_xattr_bytes: self.config.max_total_xattr_bytes,
            max_open_fids: self.config.max_open_fids,
        }
    }

    /// The limit on guest-triggered log lines, shared with the transports
    /// that carry this server's requests.
    pub(crate) fn log_limit(&self) -> &LogLimit {
        &self.log
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
        self.handle_recorded(session, req, reply, exec, cancel, None)
    }

    /// [`Server::handle`], telling `rec` (the device's in-flight record of
    /// this request) the intent of a call that is not idempotent before
    /// it runs, and the reply of every request that changes fids or the
    /// export before it goes out (see `persist::exactly_once`).
    pub(crate) fn handle_recorded<R, W, B>(
        &self,
        session: &Session<F>,
        req: &mut R,
        reply: &mut W,
        exec: &B,
        cancel: &Cancel,
        rec: Option<&dyn RequestRecord>,
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
        let fail = |reply: &mut W, e: DecodeError| self.malformed(reply, &h, e, frame_limit);
        let limit = if h.ty == MsgType::Tversion {
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
        if msize == 0 && h.ty != MsgType::Tversion {
            if self.log.admit() {
                warn!("9p: request type {} before Tversion", h.ty);
            }
            return self.send(reply, &h, Err(errno::EPROTO), MIN_MSIZE);
        }
        if h.ty == MsgType::Twrite {
            return self.write(session, &h, req, reply, exec, msize);
        }
        if h.ty == MsgType::Tgetattr && body_len == TGETATTR_BODY_SIZE {
            // The commonest request (every stat in the guest), decoded
            // from its fixed bytes without building a `Tmessage`; a body of
            // another size takes the general path and its error. Its
            // reply is encoded from the attributes on the stack, not
            // through a boxed `Rmessage` (an allocation per request).
            let mut body = [0u8; TGETATTR_BODY_SIZE];
            req.read_exact(&mut body).map_err(Error::Transport)?;
            let m = decode_tgetattr(&body);
            debug!("9p: tag {} {:?}", h.tag, m);
            return match self.getattr(session, &m, exec) {
                Ok(a) => self.send_rgetattr(reply, &h, msize, &a),
                Err(e) => self.send(reply, &h, Err(e), msize),
            };
        }
        // Most bodies are small: read them onto the stack. The commonest
        // (Tgetattr, Tclunk, Tread, one-name Twalk) fit the tiny buffer,
        // which costs no `memset` of the small one.
        let mut tiny = [0u8; TINY_BODY];
        let mut small;
        let mut large = Vec::new();
        let body: &mut [u8] = if body_len <= TINY_BODY {
            &mut tiny[..body_len]
        } else if body_len <= SMALL_BODY {
            small = [0u8; SMALL_BODY];
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
        if let Some(rec) = rec {
            self.record_intent(session, &msg, rec);
        }
        let result = match msg {
            Tmessage::Version(m) => {
                let out = self.version(session, &m);
                return self.send(reply, &h, Ok(out), MAX_MSIZE);
            }
            Tmessage::Read(m) => return self.read(session, &h, &m, reply, exec, msize),
            Tmessage::Auth(_) => Err(errno::EOPNOTSUPP),
            Tmessage::Flush(m) => {
                exec.flush(m.oldtag);
                Ok(Rmessage::Flush)
            }
            Tmessage::Attach(m) => self.attach(session, &m, exec),
            Tmessage::Walk(m) => self.walk(session, m, exec),
            Tmessage::Write(_) => unreachable_write(),
            Tmessage::Clunk(m) => self.clunk(session, m.fid, exec),
            Tmessage::Remove(m) => self.remove(session, m.fid, exec),
            Tmessage::Statfs(m) => self.statfs(session, m.fid, exec),
            Tmessage::Lopen(m) => self.lopen(session, &m, exec),
            Tmessage::Lcreate(m) => self.lcreate(session, &m, exec),
            Tmessage::Symlink(m) => self.symlink(session, &m, exec),
            Tmessage::Mknod(m) => self.mknod(session, &m, exec),
            Tmessage::Mkdir(m) => self.mkdir(session, &m, exec),
            Tmessage::Rename(m) => {
                let r = self.rename(session, &m, exec);
                // The fid's path changed: one journal record, not a new
                // snapshot (which costs a save per fid: a guest looping
                // on Trename would stall the device). Fids below a
                // renamed directory keep their old saved paths until the
                // next snapshot; a restore finds them by their handles.
                if r.is_ok() {
                    session.touch(m.fid);
                }
                r
            }
            Tmessage::Readlink(m) => self.readlink(session, m.fid, exec),
            Tmessage::Getattr(m) => {
                // Only with a body of the wrong size, which fails to
                // decode above: kept for the match to be exhaustive.
                return match self.getattr(session, &m, exec) {
                    Ok(a) => self.send_rgetattr(reply, &h, msize, &a),
                    Err(e) => self.send(reply, &h, Err(e), msize),
                };
            }
            Tmessage::Setattr(m) => self.setattr(session, &m, exec),
            Tmessage::Xattrwalk(m) => self.xattrwalk(session, &m, exec),
            Tmessage::Xattrcreate(m) => self.xattrcreate(session, m),
            Tmessage::Readdir(m) => self.readdir(session, &m, reply.available_bytes(), msize, exec),
            Tmessage::Fsync(m) => self.fsync(session, &m, exec),
            Tmessage::Lock(m) => {
                let r = self.lock(session, &m, exec, cancel);
                // The fid's granted locks may have changed.
                if r.is_ok() {
                    session.touch(m.fid);
                }
                r
            }
            Tmessage::Getlock(m) => self.getlock(session, &m, exec),
            Tmessage::Link(m) => self.link(session, &m, exec),
            Tmessage::Renameat(m) => self.renameat(session, &m, exec),
            Tmessage::Unlinkat(m) => self.unlinkat(session, &m, exec),
        };
        let rec = rec.filter(|_| records_reply(h.ty));
        self.send_recorded(reply, &h, result, msize, rec)
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
        self.send_recorded(reply, h, result, msize, None)
    }

    /// [`Server::send`], recording the encoded reply in `rec` first.
    pub(crate) fn send_recorded<W: ReplyWriter>(
        &self,
        reply: &mut W,
        h: &Header,
        result: OpResult,
        msize: u32,
        rec: Option<&dyn RequestRecord>,
    ) -> Result<Reply> {
        let msg = match result {
            Ok(m) => m,
            Err(e) => {
                debug!("9p: tag {} -> Rlerror {e}", h.tag);
                Rmessage::Lerror(e)
            }
        };
        self.send_with(reply, h, msize, rec, msg.msg_type(), |out| {
            msg.encode_body(out)
        })
    }

    /// Encodes a reply of type `ty` whose body `body` appends, and writes
    /// it to `reply` (Rlerror(EMSGSIZE) instead if it does not fit the
    /// msize or the buffer), recording it in `rec` first.
    fn send_with<W: ReplyWriter>(
        &self,
        reply: &mut W,
        h: &Header,
        msize: u32,
        rec: Option<&dyn RequestRecord>,
        ty: MsgType,
        body: impl FnOnce(&mut Vec<u8>),
    ) -> Result<Reply> {
        // Encode into a per-thread buffer: no allocation per reply.
        ENCODE_BUF.with(|buf| {
            let mut frame = buf.borrow_mut();
            encode_frame(&mut frame, ty, h.tag, body);
            if frame.len() > reply.available_bytes() || frame.len() > msize as usize {
                if self.log.admit() {
                    warn!(
                        "9p: reply of {} bytes to tag {} does not fit (msize {msize}, buffer {})",
                        frame.len(),
                        h.tag,
                        reply.available_bytes()
                    );
                }
                encode_reply(&mut frame, &Rmessage::Lerror(errno::EMSGSIZE), h.tag);
            }
            if let Some(rec) = rec {
                rec.commit(&frame);
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

    /// Writes the Rgetattr carrying `a`: a frame of fixed size built on the
    /// stack and written at once ([`rgetattr_frame`]), or, when it does
    /// not fit the msize or the buffer, what [`Server::send_with`] answers.
    fn send_rgetattr<W: ReplyWriter>(
        &self,
        reply: &mut W,
        h: &Header,
        msize: u32,
        a: &Rgetattr,
    ) -> Result<Reply> {
        if RGETATTR_FRAME_SIZE > reply.available_bytes() || RGETATTR_FRAME_SIZE > msize as usize {
            return self.send_with(reply, h, msize, None, MsgType::Rgetattr, |out| {
                encode_rgetattr(out, a)
            });
        }
        reply
            .write_all(&rgetattr_frame(h.tag, a))
            .map_err(Error::Transport)?;
        Ok(Reply {
            tag: h.tag,
            request_type: h.ty,
            reply_type: MsgType::Rgetattr.into(),
            size: RGETATTR_FRAME_SIZE as u32,
        })
    }

    /// Answers a request that does not decode (logged through the
    /// guest-log limit).
    fn malformed<W: ReplyWriter>(
        &self,
        reply: &mut W,
        h: &Header,
        e: DecodeError,
        msize: u32,
    ) -> Result<Reply> {
        if self.log.admit() {
            warn!("9p: malformed request (type {}, tag {}): {e}", h.ty, h.tag);
        }
        self.send(reply, h, Err(e.errno()), msize)
    }

    /// Runs one filesystem call of `op` through `exec`, with the
    /// filesystem's hint for it ([`Filesystem::reads_through_writer`] for
    /// Tread, [`Filesystem::metadata_is_local`] for the rest): the
    /// executor decides where it runs.
    fn call<B: Blocking, R: Interrupted + Send>(
        &self,
        exec: &B,
        op: MsgType,
        f: impl FnOnce() -> R + Send,
    ) -> R {
        let hint = match op {
            MsgType::Tread if self.fs.reads_through_writer() => CallHint::ReadsThroughWriter,
            MsgType::Tread => CallHint::MayBlock,
            _ if self.fs.metadata_is_local() => CallHint::LocalMetadata,
            _ => CallHint::MayBlock,
        };
        exec.run_hinted(op, hint, f)
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
        self.call(exec, op, || f(&self.fs, &fid))
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
        let FidKind::Open { file, .. } = &fid.kind else {
            return Err(errno::EBADF);
        };
        self.call(exec, op, || f(&self.fs, file))
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
}

/// Twrite never reaches the generic decoder path of [`Server::handle`]: it
/// is dispatched to the zero-copy path first.
fn unreachable_write() -> OpResult {
    Err(errno::EPROTO)
}
