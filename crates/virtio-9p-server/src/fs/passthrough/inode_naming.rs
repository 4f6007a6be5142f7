// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Naming inodes across a daemon restart
//! ([`Filesystem::save_inode`](crate::fs::Filesystem::save_inode) and
//! `restore_inode`).
//!
//! A saved inode (its bytes: `saved_inode.rs`) is its path below the
//! export (the names the guest walked, kept in each inode's link to its
//! parent), its `(dev, ino)`, its file type (the `S_IFMT` bits of its
//! mode), and a file handle (`name_to_handle_at`) when the export's
//! filesystem gives one.
//!
//! A restored inode must be the object the session recorded, reached the
//! way a guest's walk reaches it: never "an inode with that number".
//!
//! - The saved path is walked again from the export root with the usual
//!   checks (each name validated, no symlink followed, nothing outside
//!   the export) and kept if it ends at the same `(dev, ino)` with the
//!   same file type.
//! - Otherwise (renamed on the host meanwhile) the handle is opened
//!   (`open_by_handle_at`, which needs `CAP_DAC_READ_SEARCH`) only to learn
//!   where the file is now: it must be the recorded `(dev, ino)` and type,
//!   and its current name (`/proc/self/fd`) must walk again from the export
//!   root, with the same checks, to that same `(dev, ino)`. The fd given to
//!   the guest is the walk's, never the handle's, so a handle cannot open
//!   anything outside the export, and an unlinked file is not brought back.
//! - A handle that opens a file other than the recorded one, or of
//!   another type, cannot come from an honest save (a handle names one
//!   file and its generation): the inode is refused as forged
//!   ([`io::ErrorKind::InvalidData`], which refuses the whole state), as
//!   is a saved inode that does not parse. A file merely gone, moved out
//!   of the export or replaced is `ENOENT`/`ESTALE`: that fid alone is
//!   left out.

use std::io;
use std::os::fd::AsFd;

use super::saved_inode::{file_handle, open_handle, SavedInode, MAX_DEPTH, VERSION};
use super::{err, sys, Inode, MigrationMode, PassthroughFs};
use crate::protocol::Qid;

impl PassthroughFs {
    pub(super) fn saved_inode(&self, inode: &Inode) -> io::Result<Vec<u8>> {
        let mut names = Vec::new();
        let mut cur = inode.clone();
        let mut has_path = true;
        while !self.is_root(cur.0.dev, cur.0.ino) {
            match cur.link() {
                Some((parent, name)) if names.len() < MAX_DEPTH => {
                    names.push(name);
                    cur = parent;
                }
                _ => {
                    has_path = false;
                    names.clear();
                    break;
                }
            }
        }
        names.reverse();
        let mut out = vec![VERSION];
        out.extend_from_slice(&inode.0.dev.to_le_bytes());
        out.extend_from_slice(&inode.0.ino.to_le_bytes());
        out.extend_from_slice(&inode.0.host_type.to_le_bytes());
        out.push(u8::from(has_path));
        out.extend_from_slice(&(names.len() as u16).to_le_bytes());
        for n in &names {
            out.extend_from_slice(&(n.len() as u16).to_le_bytes());
            out.extend_from_slice(n);
        }
        let (ty, handle) = file_handle(self.fd(inode)?.as_fd()).unwrap_or((0, Vec::new()));
        out.extend_from_slice(&ty.to_le_bytes());
        out.extend_from_slice(&(handle.len() as u16).to_le_bytes());
        out.extend_from_slice(&handle);
        Ok(out)
    }

    pub(super) fn inode_from_saved(&self, saved: &[u8]) -> io::Result<(Inode, Qid)> {
        let s = SavedInode::parse(saved).ok_or_else(|| forged("a saved inode does not parse"))?;
        if self.cfg.migration_mode == MigrationMode::FindPaths {
            return self.find_saved_path(&s);
        }
        if s.has_path {
            if let Some(found) = self.walk_saved(&s.names, s.dev, s.ino, s.ty)? {
                return Ok(found);
            }
        }
        // Renamed since: the handle tells where the file is now.
        if s.handle.is_empty() || s.dev != self.root.0.dev {
            return Err(err(libc::ENOENT));
        }
        let fd = open_handle(self.fd(&self.root)?.as_fd(), s.handle_type, s.handle)?;
        let st = sys::fstat(fd.as_fd())?;
        if st.st_dev != s.dev || st.st_ino != s.ino {
            return Err(forged("a saved handle opens another file"));
        }
        if st.st_mode & libc::S_IFMT != s.ty {
            return Err(forged("a saved handle opens a file of another type"));
        }
        let at = self.proc_path(fd.as_fd());
        let path = proc_readlink(&at)?;
        drop(fd);
        // Not linked anywhere any more ("... (deleted)"), or somewhere
        // that is no path: nothing a walk can vouch for.
        if path.first() != Some(&b'/') || path.ends_with(b" (deleted)") {
            return Err(err(libc::ESTALE));
        }
        let names: Vec<&[u8]> = path
            .split(|b| *b == b'/')
            .filter(|n| !n.is_empty())
            .collect();
        if names.len() > MAX_DEPTH {
            return Err(err(libc::ESTALE));
        }
        // The path is the daemon's view (the export may be its root or a
        // directory further down): the file counts only if some tail of
        // it walks from the export root to the same file.
        for start in 0..names.len() {
            if let Some(found) = self.walk_saved(&names[start..], s.dev, s.ino, s.ty)? {
                return Ok(found);
            }
        }
        Err(err(libc::ESTALE))
    }

    /// [`MigrationMode::FindPaths`]: the file at the saved path below the
    /// export (another host: its `(dev, ino)` are not the saved ones),
    /// walked as a guest's walk is, if it has the saved file type.
    /// `ESTALE` if it is gone or of another type, or the save knew no
    /// path for it.
    fn find_saved_path(&self, s: &SavedInode<'_>) -> io::Result<(Inode, Qid)> {
        if !s.has_path {
            return Err(err(libc::ESTALE));
        }
        let mut cur = (self.root.clone(), Qid::default());
        for name in &s.names {
            if crate::fs::validate_name(name).is_err() {
                return Err(forged("a saved path has a name no walk gives"));
            }
            cur = self.lookup(&cur.0, name).map_err(|_| err(libc::ESTALE))?;
        }
        if s.names.is_empty() {
            let st = sys::fstat(self.fd(&cur.0)?.as_fd())?;
            if st.st_mode & libc::S_IFMT != s.ty {
                return Err(err(libc::ESTALE));
            }
            return Ok((cur.0, self.make_qid(&st, None)?));
        }
        if cur.0 .0.host_type != s.ty {
            return Err(err(libc::ESTALE));
        }
        Ok(cur)
    }

    /// Walks `names` from the export root as a guest's walk does; the
    /// inode if that ends at `(dev, ino)` with file type `ty`. A name that
    /// could not come from a walk (empty, `.`, `..`, with a `/`) is
    /// forged.
    fn walk_saved(
        &self,
        names: &[&[u8]],
        dev: u64,
        ino: u64,
        ty: u32,
    ) -> io::Result<Option<(Inode, Qid)>> {
        let mut cur = (self.root.clone(), Qid::default());
        for name in names {
            if crate::fs::validate_name(name).is_err() {
                return Err(forged("a saved path has a name no walk gives"));
            }
            match self.lookup(&cur.0, name) {
                Ok(next) => cur = next,
                Err(_) => return Ok(None),
            }
        }
        if cur.0 .0.dev != dev || cur.0 .0.ino != ino {
            return Ok(None);
        }
        if names.is_empty() {
            let st = sys::fstat(self.fd(&cur.0)?.as_fd())?;
            if st.st_mode & libc::S_IFMT != ty {
                return Ok(None);
            }
            return Ok(Some((cur.0, self.make_qid(&st, None)?)));
        }
        if cur.0 .0.host_type != ty {
            return Ok(None);
        }
        Ok(Some(cur))
    }
}

/// An inode no honest save wrote (see the module docs).
fn forged(why: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

/// The `/proc/self/fd` link of an fd: where the file is now.
fn proc_readlink(p: &sys::FdPath) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    let (dir, name) = p.at().unwrap_or((libc::AT_FDCWD, p.path()));
    // SAFETY: a valid dirfd (or AT_FDCWD) and C string, and a buffer
    // valid for its length.
    let n = unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;

    use super::*;
    use crate::fs::Filesystem;
    use crate::PassthroughConfig;

    fn is_root() -> bool {
        // SAFETY: geteuid cannot fail.
        unsafe { libc::geteuid() == 0 }
    }

    /// A saved inode as `saved_inode` lays it out, with any fields.
    fn blob(
        dev: u64,
        ino: u64,
        ty: u32,
        names: Option<&[&[u8]]>,
        handle: Option<(i32, Vec<u8>)>,
    ) -> Vec<u8> {
        let mut out = vec![VERSION];
        out.extend_from_slice(&dev.to_le_bytes());
        out.extend_from_slice(&ino.to_le_bytes());
        out.extend_from_slice(&ty.to_le_bytes());
        out.push(u8::from(names.is_some()));
        let names = names.unwrap_or(&[]);
        out.extend_from_slice(&(names.len() as u16).to_le_bytes());
        for n in names {
            out.extend_from_slice(&(n.len() as u16).to_le_bytes());
            out.extend_from_slice(n);
        }
        let (ty, h) = handle.unwrap_or((0, Vec::new()));
        out.extend_from_slice(&ty.to_le_bytes());
        out.extend_from_slice(&(h.len() as u16).to_le_bytes());
        out.extend_from_slice(&h);
        out
    }

    fn id(p: &Path) -> (u64, u64) {
        let m = std::fs::symlink_metadata(p).unwrap();
        (m.dev(), m.ino())
    }

    fn handle(p: &Path) -> (i32, Vec<u8>) {
        let f = std::fs::File::open(p).unwrap();
        file_handle(f.as_fd()).expect("the test filesystem gives file handles")
    }

    /// An export `share` next to a directory `outside` with a file
    /// `secret` in it, on the same filesystem.
    fn setup() -> (tempfile::TempDir, PassthroughFs) {
        let top = tempfile::tempdir().unwrap();
        std::fs::create_dir(top.path().join("share")).unwrap();
        std::fs::create_dir(top.path().join("share/d")).unwrap();
        std::fs::write(top.path().join("share/f"), b"f").unwrap();
        std::fs::write(top.path().join("share/g"), b"g").unwrap();
        std::fs::create_dir(top.path().join("outside")).unwrap();
        std::fs::write(top.path().join("outside/secret"), b"secret").unwrap();
        std::os::unix::fs::symlink(top.path().join("outside"), top.path().join("share/link"))
            .unwrap();
        let fs = PassthroughFs::new(PassthroughConfig::new(top.path().join("share"))).unwrap();
        (top, fs)
    }

    fn kind(r: io::Result<(Inode, Qid)>) -> io::Result<()> {
        r.map(drop)
    }

    #[test]
    fn test_an_honest_saved_inode_comes_back_by_path_and_by_handle() {
        let (top, fs) = setup();
        let (root, _) = fs.attach(b"", crate::fs::Cred { uid: 0, gid: 0 }).unwrap();
        let (f, q) = fs.walk(&root, b"f").unwrap();
        let saved = fs.save_inode(&f).unwrap();
        let (back, q2) = fs.restore_inode(&saved).unwrap();
        assert_eq!((back.0.dev, back.0.ino), (f.0.dev, f.0.ino));
        assert_eq!(q.path, q2.path);
        // Renamed on the host into a directory: found by its handle,
        // through a walk from the export root.
        std::fs::rename(top.path().join("share/f"), top.path().join("share/d/moved")).unwrap();
        let r = fs.restore_inode(&saved);
        if is_root() {
            let (back, _) = r.unwrap();
            assert_eq!((back.0.dev, back.0.ino), (f.0.dev, f.0.ino));
            assert_eq!(back.link().unwrap().1, b"moved");
        } else {
            assert!(r.is_err(), "no handles without CAP_DAC_READ_SEARCH");
        }
    }

    #[test]
    fn test_a_saved_path_out_of_the_export_is_refused() {
        let (top, fs) = setup();
        let (dev, ino) = id(&top.path().join("outside/secret"));
        // "..", ".", a name with a slash: no walk gives them.
        let cases: [&[&[u8]]; 4] = [
            &[b"..", b"outside", b"secret"],
            &[b".", b"f"],
            &[b"link/secret"],
            &[b""],
        ];
        for names in cases {
            let e = kind(fs.restore_inode(&blob(dev, ino, libc::S_IFREG, Some(names), None)))
                .unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{names:?}: {e}");
        }
        // Through a symlink in the export: the walk does not follow it.
        let e = kind(fs.restore_inode(&blob(
            dev,
            ino,
            libc::S_IFREG,
            Some(&[b"link", b"secret"]),
            None,
        )))
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
        // And with the outside file's own, genuine handle: opened only to
        // find its name, which no walk from the export root reaches.
        let h = handle(&top.path().join("outside/secret"));
        let e = kind(fs.restore_inode(&blob(
            dev,
            ino,
            libc::S_IFREG,
            Some(&[b"link", b"secret"]),
            Some(h),
        )))
        .unwrap_err();
        let want = if is_root() { libc::ESTALE } else { libc::EPERM };
        assert_eq!(e.raw_os_error(), Some(want), "{e}");
    }

    #[test]
    fn test_a_saved_inode_of_another_type_is_refused() {
        let (top, fs) = setup();
        let (dev, ino) = id(&top.path().join("share/f"));
        // The right path and (dev, ino), the wrong type: not that file.
        for ty in [libc::S_IFDIR, libc::S_IFLNK, libc::S_IFCHR] {
            let e = kind(fs.restore_inode(&blob(dev, ino, ty, Some(&[b"f"]), None))).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{ty:o}: {e}");
        }
        // With its handle too: a handle names one file of one type.
        let h = handle(&top.path().join("share/f"));
        let e = kind(fs.restore_inode(&blob(dev, ino, libc::S_IFDIR, Some(&[b"f"]), Some(h))))
            .unwrap_err();
        if is_root() {
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        } else {
            assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
        }
        // A type that is no type does not parse.
        let e = kind(fs.restore_inode(&blob(dev, ino, 0o7777, Some(&[b"f"]), None))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }

    #[test]
    fn test_a_handle_of_another_file_is_refused() {
        let (top, fs) = setup();
        // f's identity, g's handle, a path that no longer leads to f.
        let (dev, ino) = id(&top.path().join("share/f"));
        let h = handle(&top.path().join("share/g"));
        let e = kind(fs.restore_inode(&blob(dev, ino, libc::S_IFREG, Some(&[b"gone"]), Some(h))))
            .unwrap_err();
        if is_root() {
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
            assert!(e.to_string().contains("another file"), "{e}");
        } else {
            assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
        }
        // The inode number of a file outside the export, with a handle
        // of a file inside it: refused the same way.
        let (dev, ino) = id(&top.path().join("outside/secret"));
        let h = handle(&top.path().join("share/g"));
        let e = kind(fs.restore_inode(&blob(dev, ino, libc::S_IFREG, None, Some(h)))).unwrap_err();
        assert!(
            e.kind() == io::ErrorKind::InvalidData || e.raw_os_error() == Some(libc::EPERM),
            "{e}"
        );
    }

    #[test]
    fn test_an_unlinked_file_is_not_brought_back_by_its_handle() {
        let (top, fs) = setup();
        let p = top.path().join("share/g");
        let _open = std::fs::File::open(&p).unwrap();
        let (dev, ino) = id(&p);
        let h = handle(&p);
        std::fs::remove_file(&p).unwrap();
        let e = kind(fs.restore_inode(&blob(dev, ino, libc::S_IFREG, Some(&[b"g"]), Some(h))))
            .unwrap_err();
        let want = if is_root() { libc::ESTALE } else { libc::EPERM };
        assert_eq!(e.raw_os_error(), Some(want), "{e}");
    }

    #[test]
    fn test_find_paths_walks_with_the_escape_checks() {
        let (top, _) = setup();
        let mut cfg = PassthroughConfig::new(top.path().join("share"));
        cfg.migration_mode = MigrationMode::FindPaths;
        let fs = PassthroughFs::new(cfg).unwrap();
        let reg = libc::S_IFREG;
        // Another host: the saved (dev, ino) mean nothing, path and type do.
        let (f, _) = fs
            .restore_inode(&blob(1, 2, reg, Some(&[b"f"]), None))
            .unwrap();
        assert_eq!((f.0.dev, f.0.ino), id(&top.path().join("share/f")));
        let (d, _) = fs
            .restore_inode(&blob(1, 3, libc::S_IFDIR, Some(&[b"d"]), None))
            .unwrap();
        assert!(d.is_dir());
        let stale = |r: io::Result<(Inode, Qid)>| kind(r).unwrap_err().raw_os_error();
        // Gone, of another type, or no path saved: ESTALE.
        assert_eq!(
            stale(fs.restore_inode(&blob(1, 2, reg, Some(&[b"nope"]), None))),
            Some(libc::ESTALE)
        );
        assert_eq!(
            stale(fs.restore_inode(&blob(1, 2, libc::S_IFDIR, Some(&[b"f"]), None))),
            Some(libc::ESTALE)
        );
        assert_eq!(
            stale(fs.restore_inode(&blob(1, 2, reg, None, None))),
            Some(libc::ESTALE)
        );
        // A symlink out of the export is not followed.
        assert_eq!(
            stale(fs.restore_inode(&blob(1, 2, reg, Some(&[b"link", b"secret"]), None))),
            Some(libc::ESTALE)
        );
        // Names no walk gives are forged: the whole state is refused.
        for bad in [&b".."[..], b".", b"a/b", b""] {
            let e = kind(fs.restore_inode(&blob(1, 2, reg, Some(&[b"d", bad]), None))).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{bad:?}");
        }
    }
}
