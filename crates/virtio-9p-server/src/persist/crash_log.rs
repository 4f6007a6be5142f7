// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A session kept crash-safe in a state directory, for a daemon killed
//! under a running guest: every fid change goes to the journal of
//! [`snapshot_journal`](super::snapshot_journal) as it is made, and a successor rebuilds the
//! session from the last snapshot and the journal.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use log::{error, warn};

use super::session_format::{SavedFid, SavedSession};
use super::snapshot_journal::{self as journal, JournalMap, Replay, JOURNAL_CAPACITY};
use crate::error::{Error, Result};
use crate::fs::Filesystem;
use crate::server::session::{Fid, FidLog, FidTable};
use crate::server::{Server, Session};

/// The journal of one session (see the module docs).
struct CrashLog<F: Filesystem> {
    server: Arc<Server<F>>,
    dir: Arc<OwnedFd>,
    map: Mutex<Journal>,
    /// Snapshots written (the first included).
    snapshots: AtomicU64,
    /// Snapshots a fid change had to finish whole (see `append`).
    whole: AtomicU64,
    /// The most fids one fid change saved into a snapshot.
    max_visits: AtomicU64,
}

/// Fids a fid change saves into the snapshot being written, at least
/// (see [`CrashLog::step`]).
const MIN_STEP: usize = 32;

/// The journal and what a successor would restore from it: the last
/// snapshot's fids with every record since applied. A snapshot is this,
/// encoded: no system call per fid.
struct Journal {
    map: JournalMap,
    fids: BTreeMap<u32, SavedFid>,
    msize: u32,
    /// The epoch of the snapshot on disk.
    snap_epoch: u64,
    /// The snapshot being written, if any.
    build: Option<Build>,
    /// Fids the appends so far owe the snapshot, saved by
    /// [`FidLog::settle`] once the fid table is unlocked.
    owed: usize,
}

/// A snapshot written a few fids per fid change, from the start of the
/// active journal segment (its epoch is the segment's).
struct Build {
    writer: journal::SnapshotWriter,
    /// The next fid to save (`None`: past the last one).
    next: Option<u32>,
    /// Fids when it started.
    fids: usize,
}

impl<F: Filesystem> CrashLog<F> {
    /// Writes the session (`table` and `msize`) as a new snapshot and
    /// starts the journal again. A fid the filesystem cannot name is left
    /// out (logged): it could not be restored either. Only at the start:
    /// it saves every fid anew.
    fn snapshot(&self, j: &mut Journal, msize: u32, table: &FidTable<F>) -> Result<()> {
        let mut entries: Vec<_> = table.iter().collect();
        entries.sort_unstable_by_key(|(k, _)| **k);
        let mut fids = BTreeMap::new();
        for (fid, entry) in entries {
            match self.server.save_fid(*fid, entry) {
                Ok(f) => {
                    fids.insert(*fid, f);
                }
                Err(e) => {
                    if self.server.log_limit().admit() {
                        warn!("9p: state: fid {fid} left out of the snapshot: {e}");
                    }
                }
            }
        }
        j.fids = fids;
        j.msize = msize;
        self.write(j)
    }

    /// Writes what the journal holds (`j.fids`) as a new snapshot, whole,
    /// and starts the journal again. Only at the start, and for a record
    /// larger than a journal segment.
    fn write(&self, j: &mut Journal) -> Result<()> {
        j.build = None;
        let saved = SavedSession {
            export_id: self.server.fs.export_id(),
            msize: j.msize,
            fs_state: self.server.fs.save_state(),
            fids: j.fids.values().cloned().collect(),
        };
        let epoch = journal::new_epoch();
        let bytes = journal::encode_snapshot(epoch, &saved.encode());
        journal::write_snapshot(self.dir.as_fd(), &bytes).map_err(Error::StateDir)?;
        j.map.reset(epoch);
        j.snap_epoch = epoch;
        self.snapshots.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The active segment is full: finishes the snapshot being written
    /// (whole, if the pacing of [`CrashLog::step`] fell behind), then
    /// starts the other segment and a snapshot of its epoch. False if
    /// the snapshot could not be written: the full segment is still
    /// needed then.
    fn switch(&self, j: &mut Journal) -> bool {
        if j.build.is_some() {
            self.whole.fetch_add(1, Ordering::Relaxed);
            self.step(j, usize::MAX);
        }
        if j.snap_epoch != j.map.epoch() {
            return false;
        }
        let epoch = journal::new_epoch();
        j.map.switch(epoch);
        match journal::SnapshotWriter::create(
            self.dir.as_fd(),
            epoch,
            &self.server.fs.export_id(),
            j.msize,
            &self.server.fs.save_state(),
        ) {
            Ok(writer) => {
                j.build = Some(Build {
                    writer,
                    next: Some(0),
                    fids: j.fids.len(),
                })
            }
            Err(e) => self.build_failed(e),
        }
        true
    }

    /// Saves up to `visits` fids into the snapshot being written, and
    /// renames it into place when it has them all.
    fn step(&self, j: &mut Journal, visits: usize) {
        let Some(b) = j.build.as_mut() else {
            return;
        };
        let mut done = 0usize;
        let mut result = Ok(());
        while let Some(from) = b.next {
            if done == visits {
                break;
            }
            let Some((&fid, f)) = j.fids.range(from..).next() else {
                b.next = None;
                break;
            };
            b.next = fid.checked_add(1);
            done += 1;
            if let Err(e) = b.writer.push(f) {
                result = Err(e);
                break;
            }
        }
        self.max_visits.fetch_max(done as u64, Ordering::Relaxed);
        if result.is_ok() && b.next.is_some() {
            return;
        }
        let Some(b) = j.build.take() else {
            return;
        };
        let epoch = b.writer.epoch();
        match result.and_then(|()| b.writer.finish(self.dir.as_fd())) {
            Ok(()) => {
                j.snap_epoch = epoch;
                self.snapshots.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => self.build_failed(e),
        }
    }

    /// Fids to save into the snapshot for a record of `len` bytes, so that
    /// it is written whole by the time its segment is half full: twice the
    /// segment's share of the fids this record's bytes are, one for a fid
    /// the record may add, and at least [`MIN_STEP`]. For a guest's fid
    /// change of a few hundred bytes, a small number whatever the fids.
    fn pace(j: &Journal, len: usize) -> usize {
        let Some(b) = &j.build else {
            return 0;
        };
        let bytes = len + journal::RECORD_OVERHEAD;
        let share = (2 * b.fids * bytes).div_ceil(j.map.usable().max(1));
        MIN_STEP + 1 + share
    }

    fn build_failed(&self, e: std::io::Error) {
        // The old snapshot and the full segment stay valid; the next full
        // segment writes a whole snapshot.
        if self.server.log_limit().admit() {
            error!("9p: state: cannot write the session snapshot: {e}");
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Journal> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<F: Filesystem> FidLog<F> for CrashLog<F> {
    fn set_record(&self, fid: u32, entry: &Fid<F>) -> Vec<u8> {
        match self.server.save_fid(fid, entry) {
            Ok(saved) => journal::set_record(&saved),
            Err(e) => {
                // Not restorable: a successor must not bring back what
                // the fid named before.
                if self.server.log_limit().admit() {
                    warn!("9p: state: fid {fid} cannot be saved: {e}");
                }
                journal::remove_record(fid).to_vec()
            }
        }
    }

    /// Appends `record`, and owes the snapshot being written a few fids
    /// ([`CrashLog::pace`]), saved by `settle` after the fid table's
    /// lock is dropped: a Tgetattr never waits for a snapshot write.
    fn append(&self, record: &[u8], _msize: u32, _table: &FidTable<F>) {
        let mut j = self.lock();
        let j = &mut *j;
        if !record.is_empty() {
            if let Err(e) = journal::apply(&mut j.fids, &mut j.msize, record) {
                // Records are built here: never.
                error!("9p: state: a journal record does not apply: {e}");
            }
        }
        let fits = journal::RECORD_OVERHEAD + record.len() <= j.map.usable();
        if j.map.append(record) || (fits && self.switch(j) && j.map.append(record)) {
            j.owed = j.owed.saturating_add(Self::pace(j, record.len()));
            return;
        }
        // A record larger than a segment, or a snapshot that could not be
        // written: what the journal holds now (this change included)
        // becomes the snapshot, whole.
        self.whole.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.write(j) {
            // The old snapshot and journal stay valid, without this change.
            if self.server.log_limit().admit() {
                error!("9p: state: cannot write the session snapshot: {e}");
            }
        }
    }

    fn settle(&self) {
        let mut j = self.lock();
        let owed = std::mem::take(&mut j.owed);
        if owed > 0 {
            self.step(&mut j, owed);
        }
    }
}

impl<F: Filesystem + 'static> Server<F> {
    /// Keeps `session` crash-safe in the directory `dir` (on tmpfs; an
    /// `O_PATH` fd will do): its snapshot is written now and every later
    /// fid change is journaled (`session.snap` and `session.journal`, a
    /// 4 MiB file mapped shared: see "A session that outlives its daemon"
    /// in the design notes), so that [`Server::recover_session`] in a new
    /// process brings the session back even after this one was killed.
    /// Call it before the session serves a request. A session is
    /// journaled once; a second call fails.
    pub fn journal_session(
        self: &Arc<Self>,
        session: &Session<F>,
        dir: Arc<OwnedFd>,
    ) -> Result<()> {
        self.journal_session_sized(session, dir, JOURNAL_CAPACITY)
            .map(|_| ())
    }

    /// [`Server::journal_session`] with a journal of `capacity` bytes.
    fn journal_session_sized(
        self: &Arc<Self>,
        session: &Session<F>,
        dir: Arc<OwnedFd>,
        capacity: usize,
    ) -> Result<Arc<CrashLog<F>>> {
        let already = || {
            Error::State(crate::error::StateProblem::Malformed(
                "the session is journaled already",
            ))
        };
        // Checked before anything is written: a second snapshot would
        // start the journal anew under the first log's records.
        if session.is_journaled() {
            return Err(already());
        }
        let map = JournalMap::open(dir.as_fd(), capacity).map_err(Error::StateDir)?;
        let log = Arc::new(CrashLog {
            server: Arc::clone(self),
            dir,
            map: Mutex::new(Journal {
                map,
                fids: BTreeMap::new(),
                msize: 0,
                snap_epoch: 0,
                build: None,
                owed: 0,
            }),
            snapshots: AtomicU64::new(0),
            whole: AtomicU64::new(0),
            max_visits: AtomicU64::new(0),
        });
        session.with_table(|t, msize| {
            let mut j = log.lock();
            log.snapshot(&mut j, msize, t)
        })?;
        if !session.set_log(Arc::clone(&log) as _) {
            return Err(already());
        }
        Ok(log)
    }

    /// The session a killed daemon left in `dir`: its last snapshot with
    /// the journal's complete records replayed, restored as
    /// [`Server::restore_session`] does (open files opened again, locks
    /// taken again). `None` when `dir` holds no snapshot. State that is
    /// not state, damaged, of another version or another export is
    /// refused ([`Error::State`]); a journal of an older snapshot and a
    /// record cut short by the kill are not errors (they are logged).
    pub fn recover_session(&self, dir: BorrowedFd<'_>) -> Result<Option<Session<F>>> {
        let Some((session, replay)) = self.recover_session_replay(dir)? else {
            return Ok(None);
        };
        log::info!(
            "9p: state: recovered {} fids from a snapshot and {} journal records{}{}",
            session.fid_count(),
            replay.records,
            if replay.stale {
                " (the journal was older than the snapshot)"
            } else {
                ""
            },
            if replay.torn {
                " (a record cut short ignored)"
            } else {
                ""
            }
        );
        Ok(Some(session))
    }

    /// Removes the crash-safe state [`Server::journal_session`] keeps in
    /// `dir` (the session ended), or with `aside` moves it to
    /// `session.snap.refused` and `session.journal.refused` (state
    /// [`Server::recover_session`] refused, kept for a look).
    pub fn clear_session_state(&self, dir: BorrowedFd<'_>, aside: bool) -> Result<()> {
        if aside {
            journal::set_aside(dir)
        } else {
            journal::remove_state(dir)
        }
        .map_err(Error::StateDir)
    }

    /// [`Server::recover_session`] with what the replay found.
    pub(crate) fn recover_session_replay(
        &self,
        dir: BorrowedFd<'_>,
    ) -> Result<Option<(Session<F>, Replay)>> {
        let Some(loaded) = journal::load(dir).map_err(Error::StateDir)? else {
            return Ok(None);
        };
        let (saved, replay) = loaded.map_err(Error::State)?;
        let session = self.restore_session(&saved.encode())?;
        Ok(Some((session, replay)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::StateProblem;
    use crate::protocol::*;
    use crate::{Config, Inline, PassthroughConfig, PassthroughFs};

    fn server(dir: &std::path::Path) -> Arc<Server<PassthroughFs>> {
        let fs = PassthroughFs::new(PassthroughConfig::new(dir)).unwrap();
        Arc::new(Server::new(fs, Config::default()).unwrap())
    }

    fn call(s: &Server<PassthroughFs>, session: &Session<PassthroughFs>, m: Tmessage) -> Rmessage {
        let req = m.encode_frame(1);
        let mut r = crate::io::SliceReader::new(&req);
        let mut buf = vec![0u8; 1 << 16];
        let mut w = crate::io::SliceWriter::new(&mut buf);
        let reply = s
            .handle(session, &mut r, &mut w, &Inline, &crate::Cancel::new())
            .unwrap();
        Rmessage::decode_frame(&buf[..reply.size as usize], 1 << 20)
            .unwrap()
            .1
    }

    fn state_dir() -> (tempfile::TempDir, Arc<OwnedFd>) {
        let d = tempfile::tempdir().unwrap();
        let f = std::fs::File::open(d.path()).unwrap();
        (d, Arc::new(OwnedFd::from(f)))
    }

    fn walk(fid: u32, newfid: u32, name: &str) -> Tmessage {
        Tmessage::Walk(Twalk {
            fid,
            newfid,
            wnames: vec![name.as_bytes().to_vec()],
        })
    }

    /// Sets a session up: Tversion, Tattach fid 0, `n` files walked to
    /// fids 1..=n, fid 1 opened read-write.
    fn populate(s: &Server<PassthroughFs>, session: &Session<PassthroughFs>, n: u32) {
        let v = Tmessage::Version(Tversion {
            msize: 65536,
            version: b"9P2000.L".to_vec(),
        });
        assert!(matches!(call(s, session, v), Rmessage::Version(_)));
        let a = Tmessage::Attach(Tattach {
            fid: 0,
            afid: u32::MAX,
            uname: b"root".to_vec(),
            aname: Vec::new(),
            n_uname: 0,
        });
        assert!(matches!(call(s, session, a), Rmessage::Attach(_)));
        for i in 1..=n {
            let r = call(s, session, walk(0, i, &format!("f{i}")));
            assert!(matches!(r, Rmessage::Walk(_)), "{r:?}");
        }
        let o = Tmessage::Lopen(Tlopen {
            fid: 1,
            flags: OpenFlags::RDWR,
        });
        assert!(matches!(call(s, session, o), Rmessage::Lopen(..)));
    }

    #[test]
    fn test_a_journaled_session_comes_back_without_a_save() {
        let share = tempfile::tempdir().unwrap();
        for i in 1..=4 {
            std::fs::write(share.path().join(format!("f{i}")), b"data").unwrap();
        }
        let (_d, dir) = state_dir();
        let s = server(share.path());
        let session = Session::new();
        s.journal_session(&session, Arc::clone(&dir)).unwrap();
        assert!(s.journal_session(&session, Arc::clone(&dir)).is_err());
        populate(&s, &session, 4);
        let c = Tmessage::Clunk(Tfid { fid: 3 });
        assert_eq!(call(&s, &session, c), Rmessage::Clunk);
        // No save_session: as after a SIGKILL, only the snapshot and the
        // journal are there.
        let s2 = server(share.path());
        let (back, replay) = s2.recover_session_replay(dir.as_fd()).unwrap().unwrap();
        // Tversion, Tattach, four Twalk, Tlopen, Tclunk.
        assert_eq!(replay.records, 8, "{replay:?}");
        assert!(!replay.torn && !replay.stale);
        assert_eq!(back.msize(), 65536);
        let mut fids: Vec<u32> = back.entries().iter().map(|(f, _)| *f).collect();
        fids.sort();
        assert_eq!(fids, vec![0, 1, 2, 4]);
        // Fid 1 is open again.
        let r = call(
            &s2,
            &back,
            Tmessage::Read(Tread {
                fid: 1,
                offset: 0,
                count: 16,
            }),
        );
        assert_eq!(r, Rmessage::Read(b"data".to_vec()));
    }

    #[test]
    fn test_a_full_journal_becomes_a_snapshot() {
        let share = tempfile::tempdir().unwrap();
        for i in 1..=2 {
            std::fs::write(share.path().join(format!("f{i}")), b"x").unwrap();
        }
        let (_d, dir) = state_dir();
        let s = server(share.path());
        let session = Session::new();
        let log = s
            .journal_session_sized(&session, Arc::clone(&dir), journal::MIN_CAPACITY)
            .unwrap();
        populate(&s, &session, 2);
        // What a successor would restore if the daemon were killed now.
        let on_disk = || -> Vec<u32> {
            let (saved, _) = journal::load(dir.as_fd()).unwrap().unwrap().unwrap();
            saved.fids.iter().map(|f| f.fid).collect()
        };
        let live = || -> Vec<u32> { session.entries().iter().map(|(f, _)| *f).collect() };
        // Walks and clunks far beyond the journal's room: a kill after
        // any of them finds every fid.
        for round in 0..500u32 {
            let fid = 100 + round;
            assert!(matches!(
                call(&s, &session, walk(0, fid, "f2")),
                Rmessage::Walk(_)
            ));
            assert_eq!(on_disk(), live(), "round {round}");
            if round % 3 != 0 {
                assert_eq!(
                    call(&s, &session, Tmessage::Clunk(Tfid { fid })),
                    Rmessage::Clunk
                );
                assert_eq!(on_disk(), live(), "round {round}");
            }
        }
        // Segments switched many times, each snapshot written in steps
        // before its segment filled.
        assert!(log.snapshots.load(Ordering::Relaxed) > 10);
        assert_eq!(log.whole.load(Ordering::Relaxed), 0);
        let held: Vec<u32> = session.entries().iter().map(|(f, _)| *f).collect();
        let s2 = server(share.path());
        let (back, replay) = s2.recover_session_replay(dir.as_fd()).unwrap().unwrap();
        assert!(replay.records < 200, "{replay:?}");
        let got: Vec<u32> = back.entries().iter().map(|(f, _)| *f).collect();
        assert_eq!(got, held);
        let journal = std::fs::metadata(_d.path().join("session.journal")).unwrap();
        assert_eq!(journal.len(), journal::MIN_CAPACITY as u64);
    }

    #[test]
    fn test_a_compaction_saves_a_bounded_number_of_fids_per_request() {
        let share = tempfile::tempdir().unwrap();
        for i in 1..=3 {
            std::fs::write(share.path().join(format!("f{i}")), b"r").unwrap();
        }
        let (_state, dir) = state_dir();
        let s = server(share.path());
        let session = Session::new();
        // A 1 MiB journal: segments of 512 KiB, so that 10,000 fids and
        // a rename loop fill several.
        let log = s
            .journal_session_sized(&session, Arc::clone(&dir), 1 << 20)
            .unwrap();
        populate(&s, &session, 3);
        for fid in 100..10_100u32 {
            assert!(matches!(
                call(&s, &session, walk(0, fid, "f3")),
                Rmessage::Walk(_)
            ));
        }
        // The guest loops on Trename until two snapshots were written
        // under it.
        let before = log.snapshots.load(Ordering::Relaxed);
        let mut renames = 0u32;
        while log.snapshots.load(Ordering::Relaxed) < before + 2 {
            let name = if renames.is_multiple_of(2) {
                "g2"
            } else {
                "f2"
            };
            let r = Tmessage::Rename(Trename {
                fid: 2,
                dfid: 0,
                name: name.as_bytes().to_vec(),
            });
            assert_eq!(call(&s, &session, r), Rmessage::Rename);
            renames += 1;
            assert!(renames < 100_000, "no snapshot");
        }
        // No request saved more than a few dozen of the 10,004 fids (the
        // old compaction: all of them, under the fid table's lock), and
        // none had to finish a snapshot whole.
        let most = log.max_visits.load(Ordering::Relaxed);
        assert!(most <= 64, "{most} fids saved by one request");
        assert!(most >= MIN_STEP as u64);
        assert_eq!(log.whole.load(Ordering::Relaxed), 0);
        // Killed now: every fid comes back, fid 2 at its last name.
        let s2 = server(share.path());
        let back = s2.recover_session(dir.as_fd()).unwrap().unwrap();
        assert_eq!(back.fid_count(), 10_000 + 4);
        let r = call(
            &s2,
            &back,
            Tmessage::Getattr(Tgetattr {
                fid: 2,
                request_mask: GetattrMask::BASIC,
            }),
        );
        assert!(matches!(r, Rmessage::Getattr(_)), "{r:?}");
    }

    #[test]
    fn test_crash_state_of_another_export_is_refused() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let (_d, dir) = state_dir();
        let s = server(a.path());
        let session = Session::new();
        s.journal_session(&session, Arc::clone(&dir)).unwrap();
        let other = server(b.path());
        assert!(matches!(
            other.recover_session(dir.as_fd()),
            Err(Error::State(crate::error::StateProblem::Foreign))
        ));
    }

    /// Where the names of a saved passthrough inode end: its handle's
    /// type, length and bytes follow (saved_inode.rs's layout).
    fn names_end(saved: &[u8]) -> usize {
        let n = u16::from_le_bytes([saved[22], saved[23]]);
        let mut at = 24;
        for _ in 0..n {
            at += 2 + usize::from(u16::from_le_bytes([saved[at], saved[at + 1]]));
        }
        at
    }

    #[test]
    fn test_a_forged_state_is_refused_whole() {
        let share = tempfile::tempdir().unwrap();
        for i in 1..=2 {
            std::fs::write(share.path().join(format!("f{i}")), b"x").unwrap();
        }
        let s = server(share.path());
        let session = Session::new();
        populate(&s, &session, 2);
        let honest = s.save_session(&session).unwrap();
        let mut saved = SavedSession::decode(&honest).unwrap();
        // Fid 1 (f1, open) gets f2's handle; f1 is renamed so that its
        // path no longer leads to it and the handle is what decides.
        let f2 = saved
            .fids
            .iter()
            .find(|f| f.fid == 2)
            .unwrap()
            .inode
            .clone();
        let f1 = &mut saved.fids.iter_mut().find(|f| f.fid == 1).unwrap().inode;
        let end = names_end(f1);
        f1.truncate(end);
        f1.extend_from_slice(&f2[names_end(&f2)..]);
        std::fs::rename(share.path().join("f1"), share.path().join("moved")).unwrap();
        let r = server(share.path()).restore_session(&saved.encode());
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            match r {
                Err(Error::State(StateProblem::Forged { fid: 1, why })) => {
                    assert_eq!(why, "a saved handle opens another file")
                }
                other => panic!("{:?}", other.map(|s| s.fid_count())),
            }
            assert_eq!(
                Error::State(StateProblem::Forged {
                    fid: 1,
                    why: "a saved handle opens another file".into()
                })
                .to_string(),
                "saved session state refused: fid 1: a saved handle opens another file"
            );
        } else {
            // No handles without CAP_DAC_READ_SEARCH: fid 1 is left out.
            let back = r.unwrap();
            assert!(back.get(1).is_err());
        }
        // A path with a ".." in it: no walk wrote that.
        let mut saved = SavedSession::decode(&honest).unwrap();
        let f2 = &mut saved.fids.iter_mut().find(|f| f.fid == 2).unwrap().inode;
        let tail = f2[names_end(f2)..].to_vec();
        f2.truncate(22);
        f2.extend_from_slice(&2u16.to_le_bytes());
        for n in [&b".."[..], b"f2"] {
            f2.extend_from_slice(&(n.len() as u16).to_le_bytes());
            f2.extend_from_slice(n);
        }
        f2.extend_from_slice(&tail);
        assert!(matches!(
            server(share.path()).restore_session(&saved.encode()),
            Err(Error::State(StateProblem::Forged { fid: 2, .. }))
        ));
    }

    #[test]
    fn test_a_rename_loop_journals_one_record_each_and_no_snapshot() {
        use std::os::unix::fs::MetadataExt;
        let share = tempfile::tempdir().unwrap();
        for i in 1..=3 {
            std::fs::write(share.path().join(format!("f{i}")), b"r").unwrap();
        }
        std::fs::create_dir(share.path().join("d")).unwrap();
        std::fs::write(share.path().join("d/inner"), b"inner").unwrap();
        let (state, dir) = state_dir();
        let s = server(share.path());
        let session = Session::new();
        s.journal_session(&session, Arc::clone(&dir)).unwrap();
        populate(&s, &session, 3);
        // Many fids: a snapshot per Trename would save every one.
        for fid in 100..1100u32 {
            assert!(matches!(
                call(&s, &session, walk(0, fid, "f3")),
                Rmessage::Walk(_)
            ));
        }
        assert!(matches!(
            call(&s, &session, walk(0, 10, "d")),
            Rmessage::Walk(_)
        ));
        let w = Tmessage::Walk(Twalk {
            fid: 0,
            newfid: 11,
            wnames: vec![b"d".to_vec(), b"inner".to_vec()],
        });
        assert!(matches!(call(&s, &session, w), Rmessage::Walk(_)));
        let snap = || {
            std::fs::metadata(state.path().join("session.snap"))
                .unwrap()
                .ino()
        };
        let before = snap();
        // The guest loops on Trename (fid 2: f2 <-> g2).
        for i in 0..200 {
            let name = if i % 2 == 0 { "g2" } else { "f2" };
            let r = Tmessage::Rename(Trename {
                fid: 2,
                dfid: 0,
                name: name.as_bytes().to_vec(),
            });
            assert_eq!(call(&s, &session, r), Rmessage::Rename);
        }
        // And a directory with a walked fid below it is renamed.
        let r = Tmessage::Rename(Trename {
            fid: 10,
            dfid: 0,
            name: b"e".to_vec(),
        });
        assert_eq!(call(&s, &session, r), Rmessage::Rename);
        assert_eq!(snap(), before, "no new snapshot");
        // Killed now: the renamed fid comes back at its new name.
        let s2 = server(share.path());
        let (back, replay) = s2.recover_session_replay(dir.as_fd()).unwrap().unwrap();
        assert!(replay.records >= 201, "{replay:?}");
        let a = |session: &Session<PassthroughFs>, fid| {
            call(
                &s2,
                session,
                Tmessage::Getattr(Tgetattr {
                    fid,
                    request_mask: GetattrMask::BASIC,
                }),
            )
        };
        assert!(matches!(a(&back, 2), Rmessage::Getattr(_)), "fid 2");
        assert!(matches!(a(&back, 10), Rmessage::Getattr(_)), "fid 10");
        assert_eq!(back.fid_count(), 1000 + 3 + 1 + 2);
        // The fid below the renamed directory: by its handle (needs
        // CAP_DAC_READ_SEARCH), walked again from the export root.
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            assert!(matches!(a(&back, 11), Rmessage::Getattr(_)), "fid 11");
        }
    }
}
