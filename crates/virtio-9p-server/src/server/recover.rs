// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Exactly once across a crash: what the server records about a request
//! while it runs, and how a new daemon serves a request a killed one took
//! and did not answer.
//!
//! While a request runs, the device's in-flight record
//! ([`RequestRecord`], a slot of `crate::state::inflight`) gets:
//!
//! - before a call that is not idempotent (Tlcreate, Tmkdir, Tsymlink,
//!   Tmknod, Tlink, Tunlinkat, Trenameat, Trename) an **intent**: the
//!   time (`CLOCK_REALTIME_COARSE`, the clock of file ctimes) and, for
//!   Tunlinkat, Trenameat and Trename, the qid path of the file it moves
//!   or removes (looked up first);
//! - the encoded **reply** of every request that changes fids or the
//!   export ([`records_reply`]), before it goes out. Fid changes are
//!   journaled as they happen, before the reply, so a recorded reply
//!   means the fid table a successor restores has them.
//!
//! A successor serves a request the old daemon took and did not answer
//! ([`Server::recover`]):
//!
//! | request | recorded reply | no reply recorded |
//! |---|---|---|
//! | every recorded kind | sent as recorded; nothing runs | as below |
//! | Twalk, Tattach, Txattrwalk to a new fid | | the new fid is dropped if the journal has it; runs again |
//! | Tlopen, Txattrcreate | | the fid goes back to walked if the journal has it opened; runs again |
//! | Tclunk, Tremove | | fid gone from the journal: Rclunk/Rremove (the call happened or was about to); else runs again |
//! | Tlcreate | | fid open in the journal: Rlcreate for it; else the name exists as a regular file changed since the intent: opened (no create, no truncate), Rlcreate; else runs again |
//! | Tmkdir, Tsymlink, Tmknod | | the name exists with that type, changed since the intent: its qid; else runs again |
//! | Tlink | | the name is the fid's file, changed since the intent: Rlink; else runs again |
//! | Tunlinkat, Trenameat | | the old name still names the recorded file: runs again; else Runlinkat/Rrenameat |
//! | Trename | | the new name names the recorded file: Rrename; else runs again |
//! | Tsetattr (with a size), Tversion, the rest | | runs again (idempotent: truncating to the same size twice leaves the same file) |
//!
//! "Changed since the intent" compares the file's ctime with the intent's
//! time on the same coarse clock: a file that existed already and was
//! changed in the same clock tick as the intent is taken for the one the
//! call made.

use super::session::{Fid, FidKind};
use super::{errno, Blocking, Cancel, OpResult, Reply, Server, Session};
use crate::error::{Error, Result};
use crate::fs::Filesystem;
use crate::io::{ReplyWriter, RequestReader, SliceReader};
use crate::protocol::*;

/// Largest request a new daemon decodes to look for what a killed one
/// left done (the requests that change fids or the export are small).
const MAX_LEFT_FRAME: usize = 64 << 10;

/// The device's in-flight record of one request.
pub(crate) trait RequestRecord {
    /// Before a call that is not idempotent: the time and the qid path
    /// of what it moves or removes (0 if none).
    fn intent(&self, time: u64, qid: u64);
    /// The encoded reply, before it goes out.
    fn commit(&self, reply: &[u8]);
}

/// Whether the reply of a request of type `ty` is recorded.
pub(crate) fn records_reply(ty: u8) -> bool {
    [
        TWALK,
        TATTACH,
        TXATTRWALK,
        TLOPEN,
        TLCREATE,
        TXATTRCREATE,
        TCLUNK,
        TREMOVE,
        TMKDIR,
        TSYMLINK,
        TMKNOD,
        TLINK,
        TUNLINKAT,
        TRENAMEAT,
        TRENAME,
        TSETATTR,
    ]
    .iter()
    .any(|t| u8::from(*t) == ty)
}

/// `CLOCK_REALTIME_COARSE` in nanoseconds: the clock the kernel stamps
/// ctimes with.
pub(crate) fn coarse_now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes `ts`, valid for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

/// What a killed daemon left about a request it took and did not answer.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Left {
    /// An intent was recorded.
    pub intent: bool,
    /// Its time.
    pub time: u64,
    /// The qid path it recorded.
    pub qid: u64,
}

impl<F: Filesystem> Server<F> {
    /// Records the intent of `msg` if it is a call that is not idempotent.
    pub(super) fn record_intent(
        &self,
        session: &Session<F>,
        msg: &Tmessage,
        rec: &dyn RequestRecord,
    ) {
        let looked_up = |dfid: u32, name: &[u8]| -> u64 {
            session
                .get(dfid)
                .ok()
                .and_then(|d| self.fs.walk(&d.inode, name).ok())
                .map_or(0, |(_, q)| q.path)
        };
        let qid = match msg {
            Tmessage::Lcreate(_)
            | Tmessage::Mkdir(_)
            | Tmessage::Symlink(_)
            | Tmessage::Mknod(_)
            | Tmessage::Link(_) => 0,
            Tmessage::Unlinkat(m) => looked_up(m.dirfid, &m.name),
            Tmessage::Renameat(m) => looked_up(m.olddirfid, &m.oldname),
            Tmessage::Rename(m) => session
                .get(m.fid)
                .ok()
                .and_then(|f| self.fs.getattr(&f.inode, GetattrMask::BASIC).ok())
                .map_or(0, |a| a.qid.path),
            _ => return,
        };
        rec.intent(coarse_now(), qid);
    }

    /// The file `name` in the directory of fid `dfid` if it exists with
    /// type `ty` and changed at or after `time`.
    fn made_since(
        &self,
        session: &Session<F>,
        dfid: u32,
        name: &[u8],
        ty: Option<QidType>,
        time: u64,
    ) -> Option<(F::Inode, Qid)> {
        let dir = session.get(dfid).ok()?;
        let (inode, qid) = self.fs.walk(&dir.inode, name).ok()?;
        if ty.is_some_and(|t| qid.ty != t) {
            return None;
        }
        let a = self.fs.getattr(&inode, GetattrMask::BASIC).ok()?;
        let ctime = a.ctime_sec.saturating_mul(1_000_000_000) + a.ctime_nsec;
        (ctime >= time).then_some((inode, qid))
    }

    /// Puts fid `fid` back to walked (same file, same user) if it is open
    /// or an xattr writer.
    fn back_to_walked(&self, session: &Session<F>, fid: u32) {
        let Ok(cur) = session.get(fid) else {
            return;
        };
        if matches!(cur.kind, FidKind::Path) {
            return;
        }
        let entry = Fid {
            inode: cur.inode.clone(),
            uid: cur.uid,
            kind: FidKind::Path,
        };
        let _ = session.replace_if(fid, &cur, entry);
    }

    /// Serves `msg`, a request a killed daemon took and did not answer
    /// and whose reply it did not record (see the module docs): `Some`
    /// reply when what the request does is found done, `None` to run it
    /// again (after the fid table was put back as the request expects).
    pub(crate) fn recover(
        &self,
        session: &Session<F>,
        msg: &Tmessage,
        left: &Left,
    ) -> Option<OpResult> {
        let since = |dfid, name: &[u8], ty| {
            if left.intent {
                self.made_since(session, dfid, name, ty, left.time)
            } else {
                None
            }
        };
        match msg {
            Tmessage::Walk(m) if m.newfid != m.fid => {
                let _ = session.remove(m.newfid);
                None
            }
            Tmessage::Attach(m) => {
                let _ = session.remove(m.fid);
                None
            }
            Tmessage::Xattrwalk(m) if m.newfid != m.fid => {
                let _ = session.remove(m.newfid);
                None
            }
            Tmessage::Lopen(m) => {
                self.back_to_walked(session, m.fid);
                None
            }
            Tmessage::Xattrcreate(m) => {
                self.back_to_walked(session, m.fid);
                None
            }
            Tmessage::Clunk(m) => session.get(m.fid).is_err().then_some(Ok(Rmessage::Clunk)),
            Tmessage::Remove(m) => match session.get(m.fid) {
                // The fid goes after the file: gone, the file went first.
                Err(_) => Some(Ok(Rmessage::Remove)),
                Ok(f) => {
                    let a = self.fs.getattr(&f.inode, GetattrMask::BASIC).ok()?;
                    (a.nlink == 0).then(|| {
                        let _ = session.remove(m.fid);
                        Ok(Rmessage::Remove)
                    })
                }
            },
            Tmessage::Lcreate(m) => {
                let fid = match session.get(m.fid) {
                    Ok(f) => f,
                    Err(e) => return Some(Err(e)),
                };
                if matches!(fid.kind, FidKind::Open { .. }) {
                    // Created, opened and journaled: only the reply is missing.
                    let qid = self.fs.getattr(&fid.inode, GetattrMask::BASIC).ok()?.qid;
                    return Some(Ok(Rmessage::Lcreate(qid, 0)));
                }
                let (inode, qid) = since(m.fid, &m.name, Some(QidType::FILE))?;
                let flags = m.flags - (OpenFlags::CREATE | OpenFlags::EXCL | OpenFlags::TRUNC);
                // Created before the crash: the open is counted, not refused.
                let charge = match session.charge_open(&self.limits(), true) {
                    Ok(c) => c,
                    Err(e) => return Some(Err(e)),
                };
                let (file, _) = match self.fs.open(&inode, flags) {
                    Ok(f) => f,
                    Err(e) => return Some(Err(errno::from_io(&e))),
                };
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
                Some(
                    session
                        .replace_if(m.fid, &fid, entry)
                        .map(|_| Rmessage::Lcreate(qid, 0)),
                )
            }
            Tmessage::Mkdir(m) => {
                since(m.dfid, &m.name, Some(QidType::DIR)).map(|(_, q)| Ok(Rmessage::Mkdir(q)))
            }
            Tmessage::Symlink(m) => {
                since(m.fid, &m.name, Some(QidType::SYMLINK)).map(|(_, q)| Ok(Rmessage::Symlink(q)))
            }
            Tmessage::Mknod(m) => since(m.dfid, &m.name, None).map(|(_, q)| Ok(Rmessage::Mknod(q))),
            Tmessage::Link(m) => {
                let (_, q) = since(m.dfid, &m.name, None)?;
                let target = session.get(m.fid).ok()?;
                let t = self.fs.getattr(&target.inode, GetattrMask::BASIC).ok()?;
                (t.qid.path == q.path).then_some(Ok(Rmessage::Link))
            }
            Tmessage::Unlinkat(m) if left.intent && left.qid != 0 => {
                let dir = session.get(m.dirfid).ok()?;
                match self.fs.walk(&dir.inode, &m.name) {
                    Ok((_, q)) if q.path == left.qid => None,
                    _ => Some(Ok(Rmessage::Unlinkat)),
                }
            }
            Tmessage::Renameat(m) if left.intent && left.qid != 0 => {
                let dir = session.get(m.olddirfid).ok()?;
                match self.fs.walk(&dir.inode, &m.oldname) {
                    Ok((_, q)) if q.path == left.qid => None,
                    _ => Some(Ok(Rmessage::Renameat)),
                }
            }
            Tmessage::Rename(m) if left.intent && left.qid != 0 => {
                let dir = session.get(m.dfid).ok()?;
                match self.fs.walk(&dir.inode, &m.name) {
                    Ok((_, q)) if q.path == left.qid => Some(Ok(Rmessage::Rename)),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// Serves a request a killed daemon took and did not answer (its
    /// reply not recorded): decoded from `req`, then [`Server::recover`]
    /// answers it if what it does is found done, else it runs again as
    /// [`Server::handle_recorded`] does.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn serve_left<R, W, B>(
        &self,
        session: &Session<F>,
        req: &mut R,
        reply: &mut W,
        exec: &B,
        cancel: &Cancel,
        h: Header,
        left: &Left,
        rec: Option<&dyn RequestRecord>,
    ) -> Result<Reply>
    where
        R: RequestReader + Send,
        W: ReplyWriter + Send,
        B: Blocking,
    {
        let len = h.size as usize;
        if !records_reply(h.ty) || len > MAX_LEFT_FRAME || req.available_bytes() < len {
            return self.handle_recorded(session, req, reply, exec, cancel, rec);
        }
        let mut frame = vec![0u8; len];
        req.read_exact(&mut frame).map_err(Error::Transport)?;
        let msize = session.frame_limit();
        if let Ok((_, msg)) = Tmessage::decode_frame(&frame, msize.max(h.size)) {
            if let Some(result) = self.recover(session, &msg, left) {
                return self.send_recorded(reply, &h, result, msize, rec);
            }
        }
        let mut again = SliceReader::new(&frame);
        self.handle_recorded(session, &mut again, reply, exec, cancel, rec)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::io::{SliceReader, SliceWriter};
    use crate::{Inline, PassthroughConfig, PassthroughFs};

    fn call(s: &Server<PassthroughFs>, session: &Session<PassthroughFs>, m: Tmessage) -> Rmessage {
        let req = m.encode_frame(1);
        let mut buf = vec![0u8; 1 << 16];
        let mut w = SliceWriter::new(&mut buf);
        let reply = s
            .handle(
                session,
                &mut SliceReader::new(&req),
                &mut w,
                &Inline,
                &Cancel::new(),
            )
            .unwrap();
        Rmessage::decode_frame(&buf[..reply.size as usize], 1 << 20)
            .unwrap()
            .1
    }

    fn setup() -> (
        tempfile::TempDir,
        Arc<Server<PassthroughFs>>,
        Session<PassthroughFs>,
    ) {
        let share = tempfile::tempdir().unwrap();
        std::fs::write(share.path().join("f"), b"f").unwrap();
        let fs = PassthroughFs::new(PassthroughConfig::new(share.path())).unwrap();
        let s = Arc::new(Server::new(fs, crate::Config::default()).unwrap());
        let session = Session::new();
        let v = Tmessage::Version(Tversion {
            msize: 65536,
            version: b"9P2000.L".to_vec(),
        });
        call(&s, &session, v);
        let a = Tmessage::Attach(Tattach {
            fid: 0,
            afid: NOFID,
            uname: b"root".to_vec(),
            aname: Vec::new(),
            n_uname: 0,
        });
        assert!(matches!(call(&s, &session, a), Rmessage::Attach(_)));
        (share, s, session)
    }

    fn intent_now() -> Left {
        Left {
            intent: true,
            time: coarse_now(),
            qid: 0,
        }
    }

    #[test]
    fn test_a_create_found_done_gets_its_reply_else_runs_again() {
        let (share, s, session) = setup();
        let mkdir = Tmessage::Mkdir(Tmkdir {
            dfid: 0,
            name: b"d".to_vec(),
            mode: 0o755,
            gid: 0,
        });
        // Not done: runs again.
        assert!(s.recover(&session, &mkdir, &intent_now()).is_none());
        // Done after the intent: its qid.
        let left = intent_now();
        std::fs::create_dir(share.path().join("d")).unwrap();
        assert!(matches!(
            s.recover(&session, &mkdir, &left),
            Some(Ok(Rmessage::Mkdir(q))) if q.ty == QidType::DIR
        ));
        // There before the intent (a file of the guest's): runs again,
        // and gets its EEXIST.
        let later = Left {
            time: coarse_now() + 5_000_000_000,
            ..left
        };
        assert!(s.recover(&session, &mkdir, &later).is_none());
        // No intent recorded: the call never started.
        assert!(s.recover(&session, &mkdir, &Left::default()).is_none());

        // Tlcreate: the file is opened (not created again) into the fid.
        let w = Tmessage::Walk(Twalk {
            fid: 0,
            newfid: 5,
            wnames: Vec::new(),
        });
        assert!(matches!(call(&s, &session, w), Rmessage::Walk(_)));
        let left = intent_now();
        std::fs::write(share.path().join("c"), b"").unwrap();
        let create = Tmessage::Lcreate(Tlcreate {
            fid: 5,
            name: b"c".to_vec(),
            flags: OpenFlags::RDWR | OpenFlags::CREATE | OpenFlags::EXCL,
            mode: 0o644,
            gid: 0,
        });
        assert!(matches!(
            s.recover(&session, &create, &left),
            Some(Ok(Rmessage::Lcreate(..)))
        ));
        let wr = Tmessage::Write(Twrite {
            fid: 5,
            offset: 0,
            data: b"open".to_vec(),
        });
        assert_eq!(call(&s, &session, wr), Rmessage::Write(4));
        // The fid is open in the table now: the same reply again.
        assert!(matches!(
            s.recover(&session, &create, &Left::default()),
            Some(Ok(Rmessage::Lcreate(..)))
        ));
    }

    #[test]
    fn test_a_removal_found_done_gets_its_reply_else_runs_again() {
        let (share, s, session) = setup();
        std::fs::write(share.path().join("u"), b"u").unwrap();
        let qid = |s: &Server<PassthroughFs>, name: &[u8]| {
            let root = session.get(0).unwrap();
            s.fs.walk(&root.inode, name).unwrap().1.path
        };
        let left = Left {
            intent: true,
            time: coarse_now(),
            qid: qid(&s, b"u"),
        };
        let unlink = Tmessage::Unlinkat(Tunlinkat {
            dirfid: 0,
            name: b"u".to_vec(),
            flags: UnlinkFlags::empty(),
        });
        assert!(s.recover(&session, &unlink, &left).is_none(), "still there");
        // Kept open, so a new file cannot get its inode number back.
        let _keep = std::fs::File::open(share.path().join("u")).unwrap();
        std::fs::remove_file(share.path().join("u")).unwrap();
        assert!(matches!(
            s.recover(&session, &unlink, &left),
            Some(Ok(Rmessage::Unlinkat))
        ));
        // A new file of that name is not the one recorded.
        std::fs::write(share.path().join("u"), b"new").unwrap();
        assert!(matches!(
            s.recover(&session, &unlink, &left),
            Some(Ok(Rmessage::Unlinkat))
        ));

        std::fs::write(share.path().join("r"), b"r").unwrap();
        let left = Left {
            intent: true,
            time: coarse_now(),
            qid: qid(&s, b"r"),
        };
        let rename = Tmessage::Renameat(Trenameat {
            olddirfid: 0,
            oldname: b"r".to_vec(),
            newdirfid: 0,
            newname: b"r2".to_vec(),
        });
        assert!(s.recover(&session, &rename, &left).is_none());
        std::fs::rename(share.path().join("r"), share.path().join("r2")).unwrap();
        assert!(matches!(
            s.recover(&session, &rename, &left),
            Some(Ok(Rmessage::Renameat))
        ));

        // Tclunk and Tremove of a fid the journal no longer has.
        let clunk = Tmessage::Clunk(Tfid { fid: 9 });
        assert!(matches!(
            s.recover(&session, &clunk, &Left::default()),
            Some(Ok(Rmessage::Clunk))
        ));
        assert!(s
            .recover(
                &session,
                &Tmessage::Clunk(Tfid { fid: 0 }),
                &Left::default()
            )
            .is_none());
    }

    #[test]
    fn test_fid_changes_are_put_back_before_a_request_runs_again() {
        let (_share, s, session) = setup();
        let walk = Tmessage::Walk(Twalk {
            fid: 0,
            newfid: 3,
            wnames: vec![b"f".to_vec()],
        });
        assert!(matches!(
            call(&s, &session, walk.clone()),
            Rmessage::Walk(_)
        ));
        // The journal had the new fid, the reply was not recorded.
        assert!(s.recover(&session, &walk, &Left::default()).is_none());
        assert!(matches!(call(&s, &session, walk), Rmessage::Walk(_)));
        let open = Tmessage::Lopen(Tlopen {
            fid: 3,
            flags: OpenFlags::RDONLY,
        });
        assert!(matches!(
            call(&s, &session, open.clone()),
            Rmessage::Lopen(..)
        ));
        assert!(s.recover(&session, &open, &Left::default()).is_none());
        assert!(matches!(call(&s, &session, open), Rmessage::Lopen(..)));
        assert!(records_reply(u8::from(TWALK)) && !records_reply(u8::from(TREAD)));
    }
}
