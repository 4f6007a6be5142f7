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

use std::ffi::CStr;
use std::io;

use super::sys;

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

fn get32(path: &CStr, name: &CStr) -> Option<u32> {
    let v = sys::getxattr(path, name, 4).ok()?;
    Some(u32::from_le_bytes(v.get(..4)?.try_into().ok()?))
}

/// Reads the mapped attributes of `path` (a `/proc/self/fd/N` path).
/// Missing or malformed attributes are `None`.
pub fn read(path: &CStr) -> Mapped {
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
pub fn read_mode(path: &CStr) -> Option<u32> {
    get32(path, MODE)
}

/// Writes the attributes that are `Some`.
pub fn write(path: &CStr, m: &Mapped) -> io::Result<()> {
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

/// Whether a guest-supplied xattr name is reserved.
pub fn is_reserved(name: &[u8]) -> bool {
    name.starts_with(PREFIX)
}

/// Removes reserved names from a NUL-separated list.
pub fn filter_list(list: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(list.len());
    for name in list.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        if !is_reserved(name) {
            out.extend_from_slice(name);
            out.push(0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_filter_list_hides_reserved() {
        let list = b"user.a\0user.virtfs.uid\0security.selinux\0";
        assert_eq!(filter_list(list), b"user.a\0security.selinux\0".to_vec());
    }
}
