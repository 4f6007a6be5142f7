// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The `mapped-xattr` security model: guest ownership, mode and device
//! numbers live in `user.virtfs.*` xattrs, laid out as QEMU's 9p `local`
//! backend stores them, so shares created by QEMU keep working.
//!
//! | xattr | value |
//! |---|---|
//! | `user.virtfs.uid` | le32 |
//! | `user.virtfs.gid` | le32 |
//! | `user.virtfs.mode` | le32, file type and permission bits |
//! | `user.virtfs.rdev` | le64 |
//!
//! Host files are created `0600` (directories `0700`); symbolic links and
//! device nodes are regular host files whose mapped mode says what they
//! are (a symlink's target is the file's content). Guests can neither see
//! nor change `user.virtfs.*` attributes through the xattr messages.
//!
//! # Guest xattr names ([`host_name`], [`guest_name`])
//!
//! | guest name | host name |
//! |---|---|
//! | `user.*` (not `user.virtfs.*`) | the same |
//! | `user.virtfs.*` | refused: `EACCES` to set or remove, `ENODATA` to get |
//! | `system.posix_acl_access`, `system.posix_acl_default` | `user.virtfs.system.posix_acl_*` (QEMU's names) |
//! | `security.*`, `trusted.*` | `user.virtfs.security.*`, `user.virtfs.trusted.*` |
//! | anything else | refused with `EOPNOTSUPP` |
//!
//! So no guest xattr can reach a host namespace the kernel or an LSM gives
//! meaning to (ACLs, file capabilities, SELinux labels, `trusted.*`); the
//! guest still reads back, and lists, exactly what it set. Host xattrs
//! outside `user.*` (a host SELinux label, a host ACL) are not shown.

use std::ffi::CStr;
use std::io;

use super::sys::{self, FdPath};

/// Prefix of the reserved attributes.
pub const PREFIX: &[u8] = b"user.virtfs.";
/// Owner attribute.
pub const UID: &CStr = c"user.virtfs.uid";
/// Group attribute.
pub const GID: &CStr = c"user.virtfs.gid";
/// Mode attribute.
pub const MODE: &CStr = c"user.virtfs.mode";
/// Device number attribute.
pub const RDEV: &CStr = c"user.virtfs.rdev";
/// Host mode of mapped files.
pub const FILE_MODE: u32 = 0o600;
/// Host mode of mapped directories.
pub const DIR_MODE: u32 = 0o700;

/// The mapped attributes present on a file.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Mapped {
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
    /// Type and permissions.
    pub mode: Option<u32>,
    /// Device number.
    pub rdev: Option<u64>,
}

fn get32(path: &FdPath, name: &CStr) -> Option<u32> {
    let v = sys::getxattr(path, name, 4).ok()?;
    Some(u32::from_le_bytes(v.get(..4)?.try_into().ok()?))
}

/// Reads the mapped attributes of `path` (a `/proc/self/fd/N` path).
/// Missing or malformed attributes are `None`.
pub fn read(path: &FdPath) -> Mapped {
    let rdev = sys::getxattr(path, RDEV, 8)
        .ok()
        .and_then(|v| Some(u64::from_le_bytes(v.get(..8)?.try_into().ok()?)));
    Mapped {
        uid: get32(path, UID),
        gid: get32(path, GID),
        mode: get32(path, MODE),
        rdev,
    }
}

/// Just the mapped mode.
pub fn read_mode(path: &FdPath) -> Option<u32> {
    get32(path, MODE)
}

/// Writes the attributes that are `Some`.
pub fn write(path: &FdPath, m: &Mapped) -> io::Result<()> {
    if let Some(uid) = m.uid {
        sys::setxattr(path, UID, &uid.to_le_bytes(), 0)?;
    }
    if let Some(gid) = m.gid {
        sys::setxattr(path, GID, &gid.to_le_bytes(), 0)?;
    }
    if let Some(mode) = m.mode {
        sys::setxattr(path, MODE, &mode.to_le_bytes(), 0)?;
    }
    if let Some(rdev) = m.rdev {
        sys::setxattr(path, RDEV, &rdev.to_le_bytes(), 0)?;
    }
    Ok(())
}

/// Removes the host ACLs a new file inherited from a default ACL on its
/// host parent (the default ACL too for a directory, so it goes no
/// further). Missing ACLs, or a filesystem without them, are fine.
pub fn drop_host_acls(path: &FdPath, dir: bool) -> io::Result<()> {
    let names: &[&CStr] = if dir {
        &[c"system.posix_acl_access", c"system.posix_acl_default"]
    } else {
        &[c"system.posix_acl_access"]
    };
    for name in names {
        match sys::removexattr(path, name) {
            Err(e) if !matches!(e.raw_os_error(), Some(libc::ENODATA | libc::EOPNOTSUPP)) => {
                return Err(e)
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether a guest-supplied xattr name is reserved.
pub fn is_reserved(name: &[u8]) -> bool {
    name.starts_with(PREFIX)
}

/// The exact guest names stored under [`PREFIX`] (QEMU's ACL mapping).
const MAPPED_NAMES: [&[u8]; 2] = [b"system.posix_acl_access", b"system.posix_acl_default"];
/// The guest namespaces stored under [`PREFIX`].
const MAPPED_PREFIXES: [&[u8]; 2] = [b"security.", b"trusted."];

fn stored_mapped(guest: &[u8]) -> bool {
    MAPPED_NAMES.contains(&guest)
        || MAPPED_PREFIXES
            .iter()
            .any(|p| guest.len() > p.len() && guest.starts_with(p))
}

/// Whether `guest` is one of the ACL names.
pub fn is_acl(guest: &[u8]) -> bool {
    MAPPED_NAMES.contains(&guest)
}

/// The host name that stores the guest xattr `guest`, or the errno that
/// refuses it: `EACCES` for the reserved `user.virtfs.*` (as QEMU answers
/// a set; getters turn it into `ENODATA`), `EOPNOTSUPP` for a namespace
/// this model does not store.
pub fn host_name(guest: &[u8]) -> Result<Vec<u8>, i32> {
    if is_reserved(guest) {
        Err(libc::EACCES)
    } else if guest.starts_with(b"user.") && guest.len() > 5 {
        Ok(guest.to_vec())
    } else if stored_mapped(guest) {
        let mut v = PREFIX.to_vec();
        v.extend_from_slice(guest);
        Ok(v)
    } else {
        Err(libc::EOPNOTSUPP)
    }
}

/// The guest name of the host xattr `host`, or `None` for what the guest
/// must not see: the mapped ownership and mode, and host xattrs outside
/// `user.*`.
pub fn guest_name(host: &[u8]) -> Option<&[u8]> {
    match host.strip_prefix(PREFIX) {
        Some(rest) if stored_mapped(rest) => Some(rest),
        Some(_) => None,
        None if host.starts_with(b"user.") => Some(host),
        None => None,
    }
}

/// Turns a host NUL-separated name list into the guest's.
pub fn filter_list(list: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(list.len());
    for name in list.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        if let Some(g) = guest_name(name) {
            out.extend_from_slice(g);
            out.push(0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_filter_list_hides_reserved_and_host_names() {
        let list = b"user.a\0user.virtfs.uid\0security.selinux\0\
            user.virtfs.system.posix_acl_access\0user.virtfs.security.capability\0\
            user.virtfs.trusted.x\0system.posix_acl_default\0user.virtfs.mode\0";
        assert_eq!(
            filter_list(list),
            b"user.a\0system.posix_acl_access\0security.capability\0trusted.x\0".to_vec()
        );
    }

    #[test]
    fn test_host_name_per_namespace() {
        let ok = |g: &[u8], h: &[u8]| assert_eq!(host_name(g).unwrap(), h.to_vec());
        ok(b"user.x", b"user.x");
        ok(
            b"system.posix_acl_access",
            b"user.virtfs.system.posix_acl_access",
        );
        ok(
            b"system.posix_acl_default",
            b"user.virtfs.system.posix_acl_default",
        );
        ok(b"security.capability", b"user.virtfs.security.capability");
        ok(b"security.selinux", b"user.virtfs.security.selinux");
        ok(
            b"trusted.overlay.opaque",
            b"user.virtfs.trusted.overlay.opaque",
        );
        assert_eq!(host_name(b"user.virtfs.mode"), Err(libc::EACCES));
        assert_eq!(host_name(b"user.virtfs.security.x"), Err(libc::EACCES));
        for bad in [
            &b"system.nfs4_acl"[..],
            b"system.posix_acl_accessX",
            b"security.",
            b"user.",
            b"os2.x",
            b"x",
        ] {
            assert_eq!(host_name(bad), Err(libc::EOPNOTSUPP), "{bad:?}");
        }
        // Every stored name reads back as the guest wrote it.
        for g in [&b"user.x"[..], b"system.posix_acl_access", b"trusted.t"] {
            assert_eq!(guest_name(&host_name(g).unwrap()), Some(g));
        }
    }
}
