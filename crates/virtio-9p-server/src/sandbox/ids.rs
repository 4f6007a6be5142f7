//! User and group ids: user-namespace maps (`--uid-map`, `--gid-map`) and
//! squashing (`--translate-uid`, `--translate-gid`).

use std::fmt;
use std::io;
use std::str::FromStr;

use crate::fs::{Cred, Filesystem};
use crate::io::{ReplyWriter, RequestReader};
use crate::protocol::{
    setattr, DirEntry, Qid, Rgetattr, Rgetlock, Rstatfs, Tgetlock, Tlock, Tsetattr,
};

/// One line of a user-namespace id map: `inside:outside:count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMap {
    /// First id inside the namespace.
    pub inside: u32,
    /// First id outside (on the host).
    pub outside: u32,
    /// Number of ids.
    pub count: u32,
}

impl FromStr for IdMap {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<_> = s.split(':').collect();
        let bad = || format!("bad id map {s:?}: expected inside:outside:count");
        if parts.len() != 3 {
            return Err(bad());
        }
        let n = |p: &str| p.trim().parse::<u32>().map_err(|_| bad());
        let m = IdMap {
            inside: n(parts[0])?,
            outside: n(parts[1])?,
            count: n(parts[2])?,
        };
        if m.count == 0
            || m.inside.checked_add(m.count - 1).is_none()
            || m.outside.checked_add(m.count - 1).is_none()
        {
            return Err(format!("bad id map {s:?}: empty or overflowing range"));
        }
        Ok(m)
    }
}

/// An id squash rule (`--translate-uid` / `--translate-gid`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdSquash {
    /// `squash-guest:HOST`: every id the guest sends (the owner of new
    /// files, chown) becomes `HOST` on the host.
    Guest(u32),
    /// `squash-host:GUEST`: every host id the guest sees (getattr) reads
    /// as `GUEST`.
    Host(u32),
}

impl FromStr for IdSquash {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("bad id translation {s:?}: expected squash-guest:ID or squash-host:ID");
        let (kind, id) = s.split_once(':').ok_or_else(bad)?;
        let id = id.trim().parse::<u32>().map_err(|_| bad())?;
        match kind {
            "squash-guest" => Ok(IdSquash::Guest(id)),
            "squash-host" => Ok(IdSquash::Host(id)),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for IdSquash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdSquash::Guest(id) => write!(f, "squash-guest:{id}"),
            IdSquash::Host(id) => write!(f, "squash-host:{id}"),
        }
    }
}

/// How ids cross between guest and host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IdTranslation {
    /// For uids.
    pub uid: Option<IdSquash>,
    /// For gids.
    pub gid: Option<IdSquash>,
}

fn to_host(rule: Option<IdSquash>, id: u32) -> u32 {
    match rule {
        Some(IdSquash::Guest(h)) => h,
        _ => id,
    }
}

fn to_guest(rule: Option<IdSquash>, id: u32) -> u32 {
    match rule {
        Some(IdSquash::Host(g)) => g,
        _ => id,
    }
}

impl IdTranslation {
    /// Whether nothing is translated.
    pub fn is_identity(&self) -> bool {
        self.uid.is_none() && self.gid.is_none()
    }

    fn cred(&self, c: Cred) -> Cred {
        Cred {
            uid: to_host(self.uid, c.uid),
            gid: to_host(self.gid, c.gid),
        }
    }
}

/// A [`Filesystem`] that applies an [`IdTranslation`] around another one.
#[derive(Debug)]
pub struct Translated<F> {
    inner: F,
    ids: IdTranslation,
}

impl<F: Filesystem> Translated<F> {
    /// Wraps `inner`.
    pub fn new(inner: F, ids: IdTranslation) -> Self {
        Translated { inner, ids }
    }

    /// The wrapped filesystem.
    pub fn inner(&self) -> &F {
        &self.inner
    }
}

impl<F: Filesystem> Filesystem for Translated<F> {
    type Inode = F::Inode;
    type File = F::File;

    fn attach(&self, aname: &[u8], cred: Cred) -> io::Result<(Self::Inode, Qid)> {
        self.inner.attach(aname, self.ids.cred(cred))
    }
    fn walk(&self, dir: &Self::Inode, name: &[u8]) -> io::Result<(Self::Inode, Qid)> {
        self.inner.walk(dir, name)
    }
    fn getattr(&self, inode: &Self::Inode, mask: u64) -> io::Result<Rgetattr> {
        let mut a = self.inner.getattr(inode, mask)?;
        a.uid = to_guest(self.ids.uid, a.uid);
        a.gid = to_guest(self.ids.gid, a.gid);
        Ok(a)
    }
    fn setattr(
        &self,
        inode: &Self::Inode,
        file: Option<&Self::File>,
        attr: &Tsetattr,
    ) -> io::Result<()> {
        let mut a = attr.clone();
        if a.valid & setattr::UID != 0 {
            a.uid = to_host(self.ids.uid, a.uid);
        }
        if a.valid & setattr::GID != 0 {
            a.gid = to_host(self.ids.gid, a.gid);
        }
        self.inner.setattr(inode, file, &a)
    }
    fn statfs(&self, inode: &Self::Inode) -> io::Result<Rstatfs> {
        self.inner.statfs(inode)
    }
    fn open(&self, inode: &Self::Inode, flags: u32) -> io::Result<(Self::File, Qid)> {
        self.inner.open(inode, flags)
    }
    fn create(
        &self,
        dir: &Self::Inode,
        name: &[u8],
        flags: u32,
        mode: u32,
        cred: Cred,
    ) -> io::Result<(Self::Inode, Self::File, Qid)> {
        self.inner
            .create(dir, name, flags, mode, self.ids.cred(cred))
    }
    fn read<W: ReplyWriter>(
        &self,
        file: &Self::File,
        w: &mut W,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        self.inner.read(file, w, count, off)
    }
    fn write<R: RequestReader>(
        &self,
        file: &Self::File,
        r: &mut R,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        self.inner.write(file, r, count, off)
    }
    fn readdir(
        &self,
        file: &Self::File,
        offset: u64,
        emit: &mut dyn FnMut(DirEntry) -> bool,
    ) -> io::Result<()> {
        self.inner.readdir(file, offset, emit)
    }
    fn fsync(&self, file: &Self::File, datasync: bool) -> io::Result<()> {
        self.inner.fsync(file, datasync)
    }
    fn mkdir(&self, dir: &Self::Inode, name: &[u8], mode: u32, cred: Cred) -> io::Result<Qid> {
        self.inner.mkdir(dir, name, mode, self.ids.cred(cred))
    }
    fn symlink(
        &self,
        dir: &Self::Inode,
        name: &[u8],
        target: &[u8],
        cred: Cred,
    ) -> io::Result<Qid> {
        self.inner.symlink(dir, name, target, self.ids.cred(cred))
    }
    fn mknod(
        &self,
        dir: &Self::Inode,
        name: &[u8],
        mode: u32,
        rdev: u64,
        cred: Cred,
    ) -> io::Result<Qid> {
        self.inner.mknod(dir, name, mode, rdev, self.ids.cred(cred))
    }
    fn link(&self, target: &Self::Inode, dir: &Self::Inode, name: &[u8]) -> io::Result<()> {
        self.inner.link(target, dir, name)
    }
    fn readlink(&self, inode: &Self::Inode) -> io::Result<Vec<u8>> {
        self.inner.readlink(inode)
    }
    fn rename(&self, inode: &Self::Inode, dir: &Self::Inode, name: &[u8]) -> io::Result<()> {
        self.inner.rename(inode, dir, name)
    }
    fn renameat(
        &self,
        olddir: &Self::Inode,
        oldname: &[u8],
        newdir: &Self::Inode,
        newname: &[u8],
    ) -> io::Result<()> {
        self.inner.renameat(olddir, oldname, newdir, newname)
    }
    fn unlinkat(&self, dir: &Self::Inode, name: &[u8], flags: u32) -> io::Result<()> {
        self.inner.unlinkat(dir, name, flags)
    }
    fn remove(&self, inode: &Self::Inode) -> io::Result<()> {
        self.inner.remove(inode)
    }
    fn getxattr(&self, inode: &Self::Inode, name: &[u8], max: usize) -> io::Result<Vec<u8>> {
        self.inner.getxattr(inode, name, max)
    }
    fn listxattr(&self, inode: &Self::Inode, max: usize) -> io::Result<Vec<u8>> {
        self.inner.listxattr(inode, max)
    }
    fn setxattr(
        &self,
        inode: &Self::Inode,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> io::Result<()> {
        self.inner.setxattr(inode, name, value, flags)
    }
    fn removexattr(&self, inode: &Self::Inode, name: &[u8]) -> io::Result<()> {
        self.inner.removexattr(inode, name)
    }
    fn try_lock(&self, file: &Self::File, lock: &Tlock) -> io::Result<u8> {
        self.inner.try_lock(file, lock)
    }
    fn getlock(&self, file: &Self::File, lock: &Tgetlock) -> io::Result<Rgetlock> {
        self.inner.getlock(file, lock)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_id_options_parse() {
        assert_eq!(
            "0:1000:1".parse::<IdMap>().unwrap(),
            IdMap {
                inside: 0,
                outside: 1000,
                count: 1
            }
        );
        assert!("0:1000".parse::<IdMap>().is_err());
        assert!("0:1000:0".parse::<IdMap>().is_err());
        assert!("4294967295:0:2".parse::<IdMap>().is_err());
        assert_eq!(
            "squash-guest:1000".parse::<IdSquash>().unwrap(),
            IdSquash::Guest(1000)
        );
        assert_eq!(
            "squash-host:0".parse::<IdSquash>().unwrap().to_string(),
            "squash-host:0"
        );
        assert!("squash:1".parse::<IdSquash>().is_err());
        assert!("squash-guest:x".parse::<IdSquash>().is_err());
    }

    #[test]
    fn test_translation_rules() {
        let t = IdTranslation {
            uid: Some(IdSquash::Guest(1000)),
            gid: Some(IdSquash::Host(0)),
        };
        assert_eq!(t.cred(Cred { uid: 5, gid: 6 }), Cred { uid: 1000, gid: 6 });
        assert_eq!(to_guest(t.gid, 77), 0);
        assert_eq!(to_guest(t.uid, 77), 77);
        assert!(IdTranslation::default().is_identity());
    }
}
