//! A sequence of 9P2000.L requests against a server on a temporary export.
//!
//! Layout (one per fuzzing process, the export rebuilt for every input):
//!
//! ```text
//! <tmp>/vmm-fuzz-p9-<pid>/export/          the shared directory
//!     file, dir/inner, up -> ../canary, abs -> <tmp>/.../canary/secret,
//!     loop -> loop, dirlink -> dir
//! <tmp>/vmm-fuzz-p9-<pid>/canary/          must never be touched
//!     secret, sub/deeper
//! ```
//!
//! Checked after every request: the server returned a reply (or an error
//! only for a frame shorter than the header), the reply decodes strictly
//! within the negotiated msize, carries the request's tag and type + 1 (or
//! Rlerror with a real errno), and Rread/Rreaddir/Rwalk respect what was
//! asked. inotify watches on the directory holding the export and on the
//! canary tree report any open, read, change, creation or deletion outside
//! the export; after every input the canary tree is compared with its
//! snapshot.

#![no_main]

use std::ffi::CStr;
use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use virtio_9p_server::io::{SliceReader, SliceWriter};
use virtio_9p_server::protocol::*;
use virtio_9p_server::{
    Cancel, Config, Inline, PassthroughConfig, PassthroughFs, SecurityModel, Server, Session,
};
use vmm_fuzz_common::p9::{SessionInput, SERVER_MSIZE};

/// One entry of the canary snapshot.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    path: PathBuf,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: (i64, i64),
    ino: u64,
    nlink: u64,
    content: Vec<u8>,
}

struct Env {
    export: PathBuf,
    canary: PathBuf,
    inotify: OwnedFd,
    root_wd: i32,
    snapshot: Vec<Entry>,
    reply: Vec<u8>,
}

fn snapshot(dir: &Path) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let mut names: Vec<_> = fs::read_dir(&d)
            .expect("read canary")
            .map(|e| e.expect("canary entry").path())
            .collect();
        names.sort();
        for p in names {
            let m = fs::symlink_metadata(&p).expect("canary metadata");
            let content = if m.is_file() {
                fs::read(&p).expect("canary content")
            } else if m.file_type().is_symlink() {
                fs::read_link(&p).expect("canary link").into_os_string().into_encoded_bytes()
            } else {
                Vec::new()
            };
            if m.is_dir() {
                todo.push(p.clone());
            }
            out.push(Entry {
                path: p,
                mode: m.mode(),
                uid: m.uid(),
                gid: m.gid(),
                size: m.size(),
                mtime: (m.mtime(), m.mtime_nsec()),
                ino: m.ino(),
                nlink: m.nlink(),
                content,
            });
        }
    }
    out
}

fn watch(fd: &OwnedFd, path: &Path) -> i32 {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a valid inotify fd and C string.
    let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), c.as_ptr(), libc::IN_ALL_EVENTS) };
    assert!(wd >= 0, "inotify_add_watch {}: {}", path.display(), std::io::Error::last_os_error());
    wd
}

/// Removes the directories of fuzzing processes that are gone.
fn remove_stale(tmp: &Path) {
    let Ok(entries) = fs::read_dir(tmp) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("vmm-fuzz-p9-")) else { continue };
        let Ok(pid) = pid.parse::<i32>() else { continue };
        // SAFETY: signal 0 only checks that the process exists.
        if unsafe { libc::kill(pid, 0) } != 0 {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

impl Env {
    fn new() -> Env {
        let tmp = std::env::temp_dir();
        remove_stale(&tmp);
        let root = tmp.join(format!("vmm-fuzz-p9-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let export = root.join("export");
        let canary = root.join("canary");
        fs::create_dir_all(canary.join("sub")).expect("canary");
        fs::write(canary.join("secret"), b"top secret").expect("canary file");
        fs::write(canary.join("sub/deeper"), b"deeper secret").expect("canary file");
        // SAFETY: plain system call; the fd is owned below.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify_init1: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` is a fresh fd nobody else owns.
        let inotify = unsafe { OwnedFd::from_raw_fd(fd) };
        let root_wd = watch(&inotify, &root);
        watch(&inotify, &canary);
        watch(&inotify, &canary.join("sub"));
        let snapshot = snapshot(&canary);
        let env = Env {
            export,
            canary,
            inotify,
            root_wd,
            snapshot,
            reply: vec![0u8; SERVER_MSIZE as usize],
        };
        env.drain();
        env
    }

    /// Rebuilds the export from scratch.
    fn reset_export(&self) {
        if self.export.exists() {
            if fs::remove_dir_all(&self.export).is_err() {
                // A fuzzed chmod may have left a directory without search
                // permission for non-root runs: open it up and retry.
                let _ = std::process::Command::new("chmod").arg("-R").arg("u+rwx").arg(&self.export).status();
                fs::remove_dir_all(&self.export).expect("remove export");
            }
        }
        let e = &self.export;
        fs::create_dir(e).expect("export");
        fs::write(e.join("file"), b"hello from the export").expect("file");
        fs::create_dir(e.join("dir")).expect("dir");
        fs::write(e.join("dir/inner"), b"inner").expect("inner");
        symlink("../canary", e.join("up")).expect("symlink");
        symlink(self.canary.join("secret"), e.join("abs")).expect("symlink");
        symlink("loop", e.join("loop")).expect("symlink");
        symlink("dir", e.join("dirlink")).expect("symlink");
        self.drain();
    }

    /// Reads pending inotify events; returns the ones outside the export.
    fn events(&self) -> (Vec<String>, bool) {
        let mut bad = Vec::new();
        let mut overflow = false;
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: reading into a local buffer of the given length.
            let n = unsafe { libc::read(self.inotify.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            let mut off = 0usize;
            let hdr = std::mem::size_of::<libc::inotify_event>();
            while off + hdr <= n as usize {
                // SAFETY: the kernel wrote a whole event at `off`; read it unaligned.
                let ev: libc::inotify_event = unsafe { std::ptr::read_unaligned(buf.as_ptr().add(off).cast()) };
                let name_bytes = &buf[off + hdr..off + hdr + ev.len as usize];
                let name = CStr::from_bytes_until_nul(name_bytes)
                    .map(|c| c.to_string_lossy().into_owned())
                    .unwrap_or_default();
                off += hdr + ev.len as usize;
                if ev.mask & libc::IN_Q_OVERFLOW != 0 {
                    overflow = true;
                    continue;
                }
                let harmless = libc::IN_OPEN
                    | libc::IN_ACCESS
                    | libc::IN_CLOSE_WRITE
                    | libc::IN_CLOSE_NOWRITE
                    | libc::IN_ATTRIB
                    | libc::IN_ISDIR;
                if ev.wd == self.root_wd && name == "export" && ev.mask & !harmless == 0 {
                    continue; // the export directory itself
                }
                bad.push(format!("wd {} name {name:?} mask {:#x}", ev.wd, ev.mask));
            }
        }
        (bad, overflow)
    }

    fn drain(&self) {
        let _ = self.events();
    }
}

fn env() -> &'static Mutex<Env> {
    static ENV: std::sync::OnceLock<Mutex<Env>> = std::sync::OnceLock::new();
    ENV.get_or_init(|| Mutex::new(Env::new()))
}

fn check_reply(frame: &[u8], reply: &[u8], limit: u32) {
    let h = Header::from_bytes(frame[..HEADER_SIZE].try_into().expect("header"));
    let (tag, msg) = Rmessage::decode_frame(reply, limit)
        .unwrap_or_else(|e| panic!("malformed reply {reply:02x?} to type {}: {e}", h.ty));
    assert_eq!(tag, h.tag, "reply tag");
    match &msg {
        Rmessage::Lerror(errno) => assert!((1..4096).contains(errno), "Rlerror with errno {errno}"),
        m => assert_eq!(m.msg_type(), h.ty.wrapping_add(1), "reply type for request type {}", h.ty),
    }
    let Ok((_, req)) = Tmessage::decode_frame(frame, MAX_MSIZE) else { return };
    match (&req, &msg) {
        (Tmessage::Read(t), Rmessage::Read(data)) => assert!(data.len() <= t.count as usize),
        (Tmessage::Readdir(t), Rmessage::Readdir(data)) => {
            assert!(data.len() <= t.count as usize);
            DirEntry::decode_all(data).expect("Rreaddir entries decode");
        }
        (Tmessage::Walk(t), Rmessage::Walk(qids)) => {
            assert!(qids.len() <= t.wnames.len());
            assert!(t.wnames.is_empty() || !qids.is_empty(), "Rwalk with no qid for a non-empty walk");
        }
        (Tmessage::Write(t), Rmessage::Write(n)) => assert!(*n as usize <= t.data.len()),
        (Tmessage::Version(t), Rmessage::Version(r)) => {
            assert!(r.msize <= t.msize.max(MIN_MSIZE) && r.msize <= SERVER_MSIZE);
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let input = SessionInput::decode(data);
    let mut env = env().lock().unwrap_or_else(|e| e.into_inner());
    env.reset_export();
    let cfg = PassthroughConfig {
        shared_dir: env.export.clone(),
        readonly: input.config.readonly,
        security_model: match input.config.security_model {
            0 => SecurityModel::Passthrough,
            1 => SecurityModel::MappedXattr,
            _ => SecurityModel::None,
        },
        use_openat2: input.config.openat2,
    };
    let fs = PassthroughFs::new(cfg).expect("open the export");
    let config = Config {
        msize_max: SERVER_MSIZE,
        max_fids: 32,
        lock_wait: Some(Duration::from_millis(1)),
        ..Config::default()
    };
    let server = Server::new(fs, config).expect("server");
    let session = Session::new();
    let mut reply = std::mem::take(&mut env.reply);
    for frame in &input.frames {
        let result = server.handle(
            &session,
            &mut SliceReader::new(frame),
            &mut SliceWriter::new(&mut reply),
            &Inline,
            &Cancel::new(),
        );
        match result {
            Ok(info) => {
                assert!(frame.len() >= HEADER_SIZE);
                let limit = session.frame_limit();
                assert!(info.size <= limit, "reply of {} bytes over msize {limit}", info.size);
                let out = &reply[..info.size as usize];
                assert_eq!(out[4], info.reply_type);
                check_reply(frame, out, limit);
            }
            Err(e) => assert!(frame.len() < HEADER_SIZE, "no reply to a {}-byte frame: {e}", frame.len()),
        }
        let (bad, _) = env.events();
        assert!(bad.is_empty(), "touched outside the export: {bad:?}");
    }
    drop(session);
    drop(server);
    let now = snapshot(&env.canary);
    assert!(now == env.snapshot, "canary changed: {now:#?}");
    // The snapshot's own reads of the canary show up as events: drop them.
    env.drain();
    env.reply = reply;
});
