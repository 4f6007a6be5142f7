//! The export a fuzzed 9P server serves, with a canary directory beside it
//! that must never be opened, read, changed or replaced.
//!
//! ```text
//! <tmp>/vmm-fuzz-<tag>-<pid>/export/     the shared directory
//!     file, dir/inner, up -> ../canary, abs -> <tmp>/.../canary/secret,
//!     loop -> loop, dirlink -> dir
//! <tmp>/vmm-fuzz-<tag>-<pid>/canary/     must never be touched
//!     secret, sub/deeper
//! ```
//!
//! inotify watches on the directory holding both and on the canary tree
//! report every open, read, change, creation and deletion outside the
//! export ([`Sandbox::violations`]); [`Sandbox::canary_unchanged`] compares
//! the canary tree with its snapshot.

use std::ffi::{CStr, CString};
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

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

/// An export and its canary, watched with inotify.
#[derive(Debug)]
pub struct Sandbox {
    root: PathBuf,
    export: PathBuf,
    canary: PathBuf,
    inotify: OwnedFd,
    root_wd: i32,
    snapshot: Vec<Entry>,
}

fn snapshot(dir: &Path) -> io::Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let mut names = fs::read_dir(&d)?
            .map(|e| e.map(|e| e.path()))
            .collect::<io::Result<Vec<_>>>()?;
        names.sort();
        for p in names {
            let m = fs::symlink_metadata(&p)?;
            let content = if m.is_file() {
                fs::read(&p)?
            } else if m.file_type().is_symlink() {
                fs::read_link(&p)?.into_os_string().into_encoded_bytes()
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
    Ok(out)
}

fn watch(fd: &OwnedFd, path: &Path) -> io::Result<i32> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    // SAFETY: a valid inotify fd and C string.
    let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), c.as_ptr(), libc::IN_ALL_EVENTS) };
    if wd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(wd)
}

/// Removes the directories of fuzzing processes that are gone.
fn remove_stale(tmp: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(tmp) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
            continue;
        };
        let Ok(pid) = pid.parse::<i32>() else {
            continue;
        };
        // SAFETY: signal 0 only checks whether the process exists.
        if unsafe { libc::kill(pid, 0) } != 0 {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// Removes everything inside `dir`, keeping `dir`.
fn clear_dir(dir: &Path) -> io::Result<()> {
    for e in fs::read_dir(dir)? {
        let p = e?.path();
        let m = fs::symlink_metadata(&p)?;
        if m.is_dir() {
            fs::remove_dir_all(&p)?;
        } else {
            fs::remove_file(&p)?;
        }
    }
    Ok(())
}

impl Sandbox {
    /// Creates `<tmp>/vmm-fuzz-<tag>-<pid>` with the canary and an empty
    /// export (fill it with [`reset_export`](Self::reset_export)), and
    /// removes the directories of earlier processes that are gone.
    pub fn new(tag: &str) -> io::Result<Sandbox> {
        let tmp = std::env::temp_dir();
        let prefix = format!("vmm-fuzz-{tag}-");
        remove_stale(&tmp, &prefix);
        let root = tmp.join(format!("{prefix}{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let export = root.join("export");
        let canary = root.join("canary");
        fs::create_dir_all(canary.join("sub"))?;
        fs::create_dir(&export)?;
        fs::write(canary.join("secret"), b"top secret")?;
        fs::write(canary.join("sub/deeper"), b"deeper secret")?;
        // SAFETY: plain system call; the fd is owned right below.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh fd that nothing else owns.
        let inotify = unsafe { OwnedFd::from_raw_fd(fd) };
        let root_wd = watch(&inotify, &root)?;
        watch(&inotify, &canary)?;
        watch(&inotify, &canary.join("sub"))?;
        let snapshot = snapshot(&canary)?;
        let sb = Sandbox {
            root,
            export,
            canary,
            inotify,
            root_wd,
            snapshot,
        };
        sb.reset_export()?;
        Ok(sb)
    }

    /// The exported directory.
    pub fn export(&self) -> &Path {
        &self.export
    }

    /// The canary directory beside the export.
    pub fn canary(&self) -> &Path {
        &self.canary
    }

    /// Empties the export (keeping the directory, so a server may keep its
    /// root fd) and lays out the seed tree again.
    pub fn reset_export(&self) -> io::Result<()> {
        let e = &self.export;
        // A fuzzed chmod may have taken permissions away; the fuzzers run
        // as root, which ignores them, but restore the root's mode anyway.
        fs::set_permissions(e, fs::Permissions::from_mode(0o755))?;
        clear_dir(e)?;
        fs::write(e.join("file"), b"hello from the export")?;
        fs::create_dir(e.join("dir"))?;
        fs::write(e.join("dir/inner"), b"inner")?;
        symlink("../canary", e.join("up"))?;
        symlink(self.canary.join("secret"), e.join("abs"))?;
        symlink("loop", e.join("loop"))?;
        symlink("dir", e.join("dirlink"))?;
        self.drain();
        Ok(())
    }

    /// Pending inotify events outside the export, described. Events on
    /// the export directory itself (opened, read, its attributes or times
    /// changed) are fine; everything else in the directory that holds it, and
    /// anything at all in the canary tree, is a violation.
    pub fn violations(&self) -> Vec<String> {
        let mut bad = Vec::new();
        let mut buf = [0u8; 4096];
        let hdr = std::mem::size_of::<libc::inotify_event>();
        loop {
            // SAFETY: reading into a local buffer of the given length.
            let n =
                unsafe { libc::read(self.inotify.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            let n = n as usize;
            let mut off = 0usize;
            while off + hdr <= n {
                // SAFETY: the kernel wrote a whole event at `off` (headers
                // and names are never split across reads); read it
                // unaligned.
                let ev: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(buf.as_ptr().add(off).cast()) };
                let end = (off + hdr + ev.len as usize).min(n);
                let name = CStr::from_bytes_until_nul(&buf[off + hdr..end])
                    .map(|c| c.to_string_lossy().into_owned())
                    .unwrap_or_default();
                off = end;
                if ev.mask & libc::IN_Q_OVERFLOW != 0 {
                    bad.push("inotify queue overflow".to_string());
                    continue;
                }
                // IN_MODIFY: a Tsetattr of only the mtime of the export
                // root is reported as a modification of it.
                let harmless = libc::IN_OPEN
                    | libc::IN_ACCESS
                    | libc::IN_MODIFY
                    | libc::IN_CLOSE_WRITE
                    | libc::IN_CLOSE_NOWRITE
                    | libc::IN_ATTRIB
                    | libc::IN_ISDIR;
                if ev.wd == self.root_wd && name == "export" && ev.mask & !harmless == 0 {
                    continue;
                }
                let place = if ev.wd == self.root_wd {
                    self.root.join(&name)
                } else {
                    PathBuf::from(format!("canary watch {} / {name}", ev.wd))
                };
                bad.push(format!("{} (inotify mask {:#x})", place.display(), ev.mask));
            }
        }
        bad
    }

    /// Forgets pending events.
    pub fn drain(&self) {
        let _ = self.violations();
    }

    /// Compares the canary tree with its snapshot (then forgets the events
    /// this comparison caused).
    pub fn canary_unchanged(&self) -> bool {
        let same = snapshot(&self.canary).is_ok_and(|now| now == self.snapshot);
        self.drain();
        same
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_export_work_is_not_a_violation() {
        let sb = Sandbox::new("selftest-a").unwrap();
        fs::write(sb.export().join("new"), b"x").unwrap();
        let _ = fs::read(sb.export().join("file")).unwrap();
        fs::read_dir(sb.export()).unwrap().for_each(drop);
        assert_eq!(sb.violations(), Vec::<String>::new());
        assert!(sb.canary_unchanged());
    }

    #[test]
    fn test_regression_export_root_mtime_is_not_a_violation() {
        // p9_session found this harness false positive: a Tsetattr of only
        // the mtime of the export root shows up as IN_MODIFY on "export" in
        // the parent's watch. The export root is inside the export.
        let sb = Sandbox::new("selftest-f").unwrap();
        let c = CString::new(sb.export().as_os_str().as_encoded_bytes()).unwrap();
        let times = [
            libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            },
            libc::timespec {
                tv_sec: 1,
                tv_nsec: 0,
            },
        ];
        // SAFETY: a valid C string and two timespecs.
        let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        assert_eq!(sb.violations(), Vec::<String>::new());
    }

    #[test]
    fn test_canary_read_is_a_violation() {
        let sb = Sandbox::new("selftest-b").unwrap();
        let _ = fs::read(sb.canary().join("secret")).unwrap();
        let v = sb.violations();
        assert!(!v.is_empty(), "reading the canary went unnoticed");
        assert!(sb.canary_unchanged());
    }

    #[test]
    fn test_creation_beside_export_is_a_violation() {
        let sb = Sandbox::new("selftest-c").unwrap();
        fs::write(sb.export().join("../planted"), b"x").unwrap();
        let v = sb.violations();
        assert!(v.iter().any(|e| e.contains("planted")), "{v:?}");
    }

    #[test]
    fn test_canary_change_is_detected() {
        let sb = Sandbox::new("selftest-d").unwrap();
        fs::write(sb.canary().join("sub/deeper"), b"changed").unwrap();
        assert!(!sb.canary_unchanged());
    }

    #[test]
    fn test_reset_restores_the_seed_tree() {
        let sb = Sandbox::new("selftest-e").unwrap();
        fs::create_dir_all(sb.export().join("a/b/c")).unwrap();
        fs::remove_file(sb.export().join("file")).unwrap();
        sb.reset_export().unwrap();
        assert!(!sb.export().join("a").exists());
        assert_eq!(fs::read(sb.export().join("dir/inner")).unwrap(), b"inner");
        assert_eq!(
            fs::read_link(sb.export().join("up")).unwrap(),
            Path::new("../canary")
        );
        assert_eq!(sb.violations(), Vec::<String>::new());
    }
}
