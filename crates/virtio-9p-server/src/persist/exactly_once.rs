// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Exactly once across a crash: what the server records about a request
//! while it runs, and how a new daemon serves a request a killed one took
//! and did not answer.
//!
//! While a request runs, the device's in-flight record
//! (`RequestRecord`, a slot of `inflight_table`) gets:
//!
//! - before a call that is not idempotent (Tlcreate, Tmkdir, Tsymlink,
//!   Tmknod, Tlink, Tunlinkat, Trenameat, Trename) an **intent**: the
//!   identity (qid path) of the file the call works on, looked up just
//!   before it: for Tunlinkat and Trenameat the file at the old name, for
//!   Trename the fid's file, for the calls that create a name whatever
//!   that name held already (0: nothing). The time is recorded too, for
//!   a reader of the table, and never used to decide anything;
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
//! | Tlcreate | | fid open in the journal: Rlcreate for it; else the name was free at the intent and is a regular file now: opened (no create, no truncate), Rlcreate; else runs again |
//! | Tmkdir, Tsymlink, Tmknod | | the name was free at the intent and exists now with that type: its qid; else runs again |
//! | Tlink | | the name was free at the intent and is the fid's file now: Rlink; else runs again |
//! | Tunlinkat | | the old name still names the recorded file: runs again; else Runlinkat |
//! | Trenameat | | the new name names the recorded file and the old name no longer does: Rrenameat; else runs again |
//! | Trename | | the new name names the recorded file: Rrename; else runs again |
//! | Tsetattr (with a size), Tversion, the rest | | runs again (idempotent: truncating to the same size twice leaves the same file) |
//!
//! Every decision compares file identities (qid paths, from `(dev, ino)`)
//! the journal recorded with what the export holds now: no clock window,
//! which would be the whole downtime and, on an NFS or FUSE export,
//! another machine's clock. "Runs again" is exact too: a call whose
//! postcondition is not there did not happen (a failed call changes
//! nothing), and running it gets the answer it would have got, EEXIST
//! when the name was taken before the call. What the journal cannot tell
//! apart is a host process doing the very same thing to the same name
//! while the daemon was down.

use super::inflight_table::{Left, RequestRecord};
use crate::error::{Error, Result};
use crate::fs::Filesystem;
use crate::io::{ReplyWriter, RequestReader, SliceReader};
use crate::protocol::*;
use crate::server::session::{Fid, FidKind};
use crate::server::{errno, records_reply, Blocking, Cancel, OpResult, Reply, Server, Session};

/// Largest request a new daemon decodes to look for what a killed one
/// left done (the requests that change fids or the export are small).
const MAX_LEFT_FRAME: usize = 64 << 10;

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

impl<F: Filesystem> Server<F> {
    /// Records the intent of `msg` if it is a call that is not idempotent.
    pub(crate) fn record_intent(
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
            Tmessage::Lcreate(m) => looked_up(m.fid, &m.name),
            Tmessage::Mkdir(m) => looked_up(m.dfid, &m.name),
            Tmessage::Symlink(m) => looked_up(m.fid, &m.name),
            Tmessage::Mknod(m) => looked_up(m.dfid, &m.name),
            Tmessage::Link(m) => looked_up(m.dfid, &m.name),
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
    /// type `ty` and the intent `left` found the name free: the call made
    /// it.
    fn made(
        &self,
        session: &Session<F>,
        dfid: u32,
        name: &[u8],
        ty: Option<QidType>,
        left: &Left,
    ) -> Option<(F::Inode, Qid)> {
        if !left.intent || left.qid != 0 {
            // Never started, or the name was taken: the call failed (or
            // fails when it runs again) with EEXIST.
            return None;
        }
        let dir = session.get(dfid).ok()?;
        let (inode, qid) = self.fs.walk(&dir.inode, name).ok()?;
        if ty.is_some_and(|t| qid.ty != t) {
            return None;
        }
        Some((inode, qid))
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
        if left.intent {
            log::debug!(
                "9p: recover: {msg:?} had an intent (at {} ns, file {:#x})",
                left.time,
                left.qid
            );
        }
        let since = |dfid, name: &[u8], ty| self.made(session, dfid, name, ty, left);
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
                let old = session.get(m.olddirfid).ok()?;
                if let Ok((_, q)) = self.fs.walk(&old.inode, &m.oldname) {
                    if q.path == left.qid {
                        return None;
                    }
                }
                let new = session.get(m.newdirfid).ok()?;
                match self.fs.walk(&new.inode, &m.newname) {
                    Ok((_, q)) if q.path == left.qid => Some(Ok(Rmessage::Renameat)),
                    _ => None,
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

    /// The device's record, as the in-flight table keeps it.
    #[derive(Default)]
    struct Rec(std::sync::Mutex<Option<(u64, u64)>>);

    impl RequestRecord for Rec {
        fn intent(&self, time: u64, qid: u64) {
            *self.0.lock().unwrap() = Some((time, qid));
        }
        fn commit(&self, _reply: &[u8]) {}
    }

    /// What the server records before running `msg`.
    fn intent(s: &Server<PassthroughFs>, session: &Session<PassthroughFs>, m: &Tmessage) -> Left {
        let rec = Rec::default();
        s.record_intent(session, m, &rec);
        let (time, qid) = rec.0.lock().unwrap().expect("an intent is recorded");
        Left {
            intent: true,
            time,
            qid,
        }
    }

    fn walk_to(s: &Server<PassthroughFs>, session: &Session<PassthroughFs>, fid: u32, name: &str) {
        let w = Tmessage::Walk(Twalk {
            fid: 0,
            newfid: fid,
            wnames: if name.is_empty() {
                Vec::new()
            } else {
                vec![name.as_bytes().to_vec()]
            },
        });
        assert!(matches!(call(s, session, w), Rmessage::Walk(_)));
    }

    /// One call that is not idempotent: how to set it up, the request,
    /// what the call does to the export (done here on the host, as the
    /// killed daemon's syscall did), and the reply expected when found
    /// done.
    struct Case {
        name: &'static str,
        prepare: fn(&Path, &Server<PassthroughFs>, &Session<PassthroughFs>),
        msg: Tmessage,
        syscall: fn(&Path),
        done: fn(&Rmessage) -> bool,
    }

    use std::path::Path;

    fn cases() -> Vec<Case> {
        vec![
            Case {
                name: "Tmkdir",
                prepare: |_, _, _| {},
                msg: Tmessage::Mkdir(Tmkdir {
                    dfid: 0,
                    name: b"d".to_vec(),
                    mode: 0o755,
                    gid: 0,
                }),
                syscall: |p| std::fs::create_dir(p.join("d")).unwrap(),
                done: |r| matches!(r, Rmessage::Mkdir(q) if q.ty == QidType::DIR),
            },
            Case {
                name: "Tsymlink",
                prepare: |_, _, _| {},
                msg: Tmessage::Symlink(Tsymlink {
                    fid: 0,
                    name: b"s".to_vec(),
                    symtgt: b"f".to_vec(),
                    gid: 0,
                }),
                syscall: |p| std::os::unix::fs::symlink("f", p.join("s")).unwrap(),
                done: |r| matches!(r, Rmessage::Symlink(q) if q.ty == QidType::SYMLINK),
            },
            Case {
                name: "Tmknod",
                prepare: |_, _, _| {},
                msg: Tmessage::Mknod(Tmknod {
                    dfid: 0,
                    name: b"n".to_vec(),
                    mode: libc::S_IFIFO | 0o644,
                    major: 0,
                    minor: 0,
                    gid: 0,
                }),
                syscall: |p| {
                    let c =
                        std::ffi::CString::new(p.join("n").into_os_string().into_encoded_bytes())
                            .unwrap();
                    // SAFETY: a valid C string.
                    let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFIFO | 0o644, 0) };
                    assert_eq!(r, 0);
                },
                done: |r| matches!(r, Rmessage::Mknod(_)),
            },
            Case {
                name: "Tlcreate",
                prepare: |_, s, session| walk_to(s, session, 5, ""),
                msg: Tmessage::Lcreate(Tlcreate {
                    fid: 5,
                    name: b"c".to_vec(),
                    flags: OpenFlags::RDWR | OpenFlags::CREATE | OpenFlags::EXCL,
                    mode: 0o644,
                    gid: 0,
                }),
                syscall: |p| std::fs::write(p.join("c"), b"").unwrap(),
                done: |r| matches!(r, Rmessage::Lcreate(q, 0) if q.ty == QidType::FILE),
            },
            Case {
                name: "Tlink",
                prepare: |_, s, session| walk_to(s, session, 6, "f"),
                msg: Tmessage::Link(Tlink {
                    dfid: 0,
                    fid: 6,
                    name: b"l".to_vec(),
                }),
                syscall: |p| std::fs::hard_link(p.join("f"), p.join("l")).unwrap(),
                done: |r| matches!(r, Rmessage::Link),
            },
            Case {
                name: "Tunlinkat",
                prepare: |p, _, _| std::fs::write(p.join("u"), b"u").unwrap(),
                msg: Tmessage::Unlinkat(Tunlinkat {
                    dirfid: 0,
                    name: b"u".to_vec(),
                    flags: UnlinkFlags::empty(),
                }),
                syscall: |p| std::fs::remove_file(p.join("u")).unwrap(),
                done: |r| matches!(r, Rmessage::Unlinkat),
            },
            Case {
                name: "Trenameat",
                prepare: |p, _, _| std::fs::write(p.join("r"), b"r").unwrap(),
                msg: Tmessage::Renameat(Trenameat {
                    olddirfid: 0,
                    oldname: b"r".to_vec(),
                    newdirfid: 0,
                    newname: b"r2".to_vec(),
                }),
                syscall: |p| std::fs::rename(p.join("r"), p.join("r2")).unwrap(),
                done: |r| matches!(r, Rmessage::Renameat),
            },
            Case {
                name: "Trename",
                prepare: |p, s, session| {
                    std::fs::write(p.join("q"), b"q").unwrap();
                    walk_to(s, session, 7, "q");
                },
                msg: Tmessage::Rename(Trename {
                    fid: 7,
                    dfid: 0,
                    name: b"q2".to_vec(),
                }),
                syscall: |p| std::fs::rename(p.join("q"), p.join("q2")).unwrap(),
                done: |r| matches!(r, Rmessage::Rename),
            },
        ]
    }

    #[test]
    fn test_each_call_at_each_crash_point_is_decided_by_identity() {
        for case in cases() {
            let (share, s, session) = setup();
            let p = share.path();
            (case.prepare)(p, &s, &session);
            let m = &case.msg;
            // Killed before the intent: the call never started.
            assert!(
                s.recover(&session, m, &Left::default()).is_none(),
                "{}: no intent",
                case.name
            );
            let left = intent(&s, &session, m);
            // Killed between the intent and the syscall: runs again.
            assert!(
                s.recover(&session, m, &left).is_none(),
                "{}: intent, no syscall",
                case.name
            );
            (case.syscall)(p);
            // Killed between the syscall and the recorded reply: found
            // done, whatever the clocks say (an export's ctime may come
            // from another machine's clock, ahead or behind).
            for time in [0, left.time, u64::MAX] {
                let left = Left { time, ..left };
                match s.recover(&session, m, &left) {
                    Some(Ok(r)) => assert!((case.done)(&r), "{}: {r:?}", case.name),
                    other => panic!("{}: syscall done, time {time}: {other:?}", case.name),
                }
            }
        }
    }

    #[test]
    fn test_a_name_taken_before_the_call_is_not_taken_for_its_work() {
        for case in cases().into_iter().take(5) {
            let (share, s, session) = setup();
            let p = share.path();
            (case.prepare)(p, &s, &session);
            // The name exists before the intent (the guest's own file, or
            // a host's): the call failed with EEXIST, and runs again to
            // get it, even though the name exists with the right type.
            (case.syscall)(p);
            let left = intent(&s, &session, &case.msg);
            assert_ne!(left.qid, 0, "{}", case.name);
            assert!(
                s.recover(&session, &case.msg, &left).is_none(),
                "{}",
                case.name
            );
        }
    }

    #[test]
    fn test_a_move_not_done_by_the_call_is_not_taken_for_it() {
        let (share, s, session) = setup();
        let p = share.path();
        std::fs::write(p.join("u"), b"u").unwrap();
        let unlink = Tmessage::Unlinkat(Tunlinkat {
            dirfid: 0,
            name: b"u".to_vec(),
            flags: UnlinkFlags::empty(),
        });
        let left = intent(&s, &session, &unlink);
        // Kept open, so a new file cannot get its inode number back; a
        // new file of that name is not the one recorded: removed.
        let _keep = std::fs::File::open(p.join("u")).unwrap();
        std::fs::remove_file(p.join("u")).unwrap();
        std::fs::write(p.join("u"), b"new").unwrap();
        assert!(matches!(
            s.recover(&session, &unlink, &left),
            Some(Ok(Rmessage::Unlinkat))
        ));
        // A Trenameat whose file is neither at the old nor at the new
        // name (moved elsewhere by the host): not the call's work.
        std::fs::write(p.join("r"), b"r").unwrap();
        let rename = Tmessage::Renameat(Trenameat {
            olddirfid: 0,
            oldname: b"r".to_vec(),
            newdirfid: 0,
            newname: b"r2".to_vec(),
        });
        let left = intent(&s, &session, &rename);
        std::fs::rename(p.join("r"), p.join("elsewhere")).unwrap();
        assert!(s.recover(&session, &rename, &left).is_none());

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
        let remove = Tmessage::Remove(Tfid { fid: 9 });
        assert!(matches!(
            s.recover(&session, &remove, &Left::default()),
            Some(Ok(Rmessage::Remove))
        ));
        // Tremove of a fid still there: done once its file has no link.
        walk_to(&s, &session, 10, "f");
        let remove = Tmessage::Remove(Tfid { fid: 10 });
        assert!(s.recover(&session, &remove, &Left::default()).is_none());
        std::fs::remove_file(p.join("f")).unwrap();
        assert!(matches!(
            s.recover(&session, &remove, &Left::default()),
            Some(Ok(Rmessage::Remove))
        ));
        assert!(session.get(10).is_err());
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
        assert!(
            records_reply(u8::from(MsgType::Twalk)) && !records_reply(u8::from(MsgType::Tread))
        );
    }
}
