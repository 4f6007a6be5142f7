// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The byte format of a saved 9P session, for a daemon restarted under a
//! running guest ([`Server::save_session`](crate::Server::save_session),
//! [`Server::restore_session`](crate::Server::restore_session)).
//!
//! ```text
//! magic "V9PSTATE" | version u32 | body length u32 | body | crc32 u32
//! body: export id (bytes32) | msize u32 | filesystem state (bytes32)
//!       | fid count u32 | fid*
//! fid:  fid u32 | uid u32 | inode (bytes16) | kind u8 and its fields
//!       kind 0 walked | 1 open: flags u32, lock count u8, Tlock (bytes16)*
//!       | 2 xattr read: value (bytes32) | 3 xattr write: name (bytes16),
//!       size u32, flags u32, data (bytes32)
//! ```
//!
//! Integers are little-endian; `bytes16`/`bytes32` are a length of that
//! width then the bytes. The CRC-32 covers everything before it, so a file
//! cut short or damaged is refused, never half-used. Sizes are bounded:
//! at most [`MAX_FIDS`] fids, [`MAX_INODE_ID`] bytes of inode id and
//! [`MAX_LOCKS_PER_FID`] locks per fid, xattr buffers within the server's
//! xattr limits: about 130 bytes per walked fid of a short path.

use crate::error::StateProblem;

/// The magic bytes a state starts with.
const MAGIC: &[u8; 8] = b"V9PSTATE";
/// The format version this build writes and reads (2: saved inodes carry
/// their file type).
pub(crate) const VERSION: u32 = 2;
/// Most fids a state holds (the largest `Config::max_fids` it can carry).
pub(crate) const MAX_FIDS: usize = 1 << 20;
/// Largest inode id ([`Filesystem::save_inode`](crate::fs::Filesystem::save_inode)).
pub(crate) const MAX_INODE_ID: usize = 8192;
/// Most granted Tlocks remembered per open fid; past it the fid's locks
/// are not restored (and a restore says so).
pub(crate) const MAX_LOCKS_PER_FID: usize = 32;

/// One saved fid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SavedFid {
    pub fid: u32,
    pub uid: u32,
    pub inode: Vec<u8>,
    pub kind: SavedKind,
}

/// What a saved fid was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SavedKind {
    Walked,
    Open {
        flags: u32,
        /// Encoded Tlock frames granted on it, in order; `None` when more
        /// than [`MAX_LOCKS_PER_FID`] were taken (not restorable).
        locks: Option<Vec<Vec<u8>>>,
    },
    XattrRead(Vec<u8>),
    XattrWrite {
        name: Vec<u8>,
        size: u32,
        flags: u32,
        data: Vec<u8>,
    },
}

/// A whole saved session.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct SavedSession {
    pub export_id: Vec<u8>,
    pub msize: u32,
    pub fs_state: Vec<u8>,
    pub fids: Vec<SavedFid>,
}

fn put_bytes16(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_bytes32(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// The start of a saved session's body, before the fid count: export id,
/// msize and the filesystem's state.
pub(crate) fn body_prefix(export_id: &[u8], msize: u32, fs_state: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(12 + export_id.len() + fs_state.len());
    put_bytes32(&mut out, export_id);
    out.extend_from_slice(&msize.to_le_bytes());
    put_bytes32(&mut out, fs_state);
    out
}

/// The header of a saved session whose body is `body_len` bytes (the
/// body, then a CRC-32 of header and body, follow it).
pub(crate) fn session_header(body_len: usize) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(MAGIC);
    out[8..12].copy_from_slice(&VERSION.to_le_bytes());
    out[12..].copy_from_slice(&(body_len as u32).to_le_bytes());
    out
}

impl SavedSession {
    /// The encoded state (see the module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(64 + self.fids.len() * 64);
        body.extend_from_slice(&body_prefix(&self.export_id, self.msize, &self.fs_state));
        body.extend_from_slice(&(self.fids.len() as u32).to_le_bytes());
        for f in &self.fids {
            f.encode_into(&mut body);
        }
        let mut out = Vec::with_capacity(body.len() + 20);
        out.extend_from_slice(&session_header(body.len()));
        out.extend_from_slice(&body);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parses `bytes`, checking the magic, version, length and checksum
    /// first, then every field's bounds.
    pub fn decode(bytes: &[u8]) -> Result<SavedSession, StateProblem> {
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err(StateProblem::NotState);
        }
        let header = MAGIC.len() + 8;
        if bytes.len() < header {
            return Err(StateProblem::Truncated {
                len: bytes.len(),
                needed: header,
            });
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap_or_default());
        if version != VERSION {
            return Err(StateProblem::Version {
                found: version,
                expected: VERSION,
            });
        }
        let body_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap_or_default()) as usize;
        let needed = header + body_len + 4;
        if bytes.len() < needed {
            return Err(StateProblem::Truncated {
                len: bytes.len(),
                needed,
            });
        }
        if bytes.len() > needed {
            return Err(StateProblem::Malformed("bytes after the checksum"));
        }
        let (data, crc) = bytes.split_at(header + body_len);
        let crc = u32::from_le_bytes(crc.try_into().unwrap_or_default());
        if crc32fast::hash(data) != crc {
            return Err(StateProblem::Checksum);
        }
        let mut r = Reader(&data[header..]);
        let export_id = r.bytes32()?.to_vec();
        let msize = r.u32()?;
        let fs_state = r.bytes32()?.to_vec();
        let n = r.u32()? as usize;
        if n > MAX_FIDS {
            return Err(StateProblem::Malformed("too many fids"));
        }
        let mut fids = Vec::with_capacity(n.min(4096));
        for _ in 0..n {
            fids.push(SavedFid::decode_from(&mut r)?);
        }
        if !r.0.is_empty() {
            return Err(StateProblem::Malformed("bytes after the last fid"));
        }
        Ok(SavedSession {
            export_id,
            msize,
            fs_state,
            fids,
        })
    }
}

impl SavedFid {
    /// Appends the fid's encoding (the `fid` of the module docs).
    pub fn encode_into(&self, body: &mut Vec<u8>) {
        body.extend_from_slice(&self.fid.to_le_bytes());
        body.extend_from_slice(&self.uid.to_le_bytes());
        put_bytes16(body, &self.inode);
        match &self.kind {
            SavedKind::Walked => body.push(0),
            SavedKind::Open { flags, locks } => {
                body.push(1);
                body.extend_from_slice(&flags.to_le_bytes());
                match locks {
                    None => body.push(u8::MAX),
                    Some(l) => {
                        body.push(l.len() as u8);
                        for frame in l {
                            put_bytes16(body, frame);
                        }
                    }
                }
            }
            SavedKind::XattrRead(v) => {
                body.push(2);
                put_bytes32(body, v);
            }
            SavedKind::XattrWrite {
                name,
                size,
                flags,
                data,
            } => {
                body.push(3);
                put_bytes16(body, name);
                body.extend_from_slice(&size.to_le_bytes());
                body.extend_from_slice(&flags.to_le_bytes());
                put_bytes32(body, data);
            }
        }
    }

    /// Parses one fid's encoding, checking every field's bounds.
    pub(crate) fn decode_from(r: &mut Reader<'_>) -> Result<SavedFid, StateProblem> {
        let fid = r.u32()?;
        let uid = r.u32()?;
        let inode = r.bytes16()?;
        if inode.len() > MAX_INODE_ID {
            return Err(StateProblem::Malformed("inode id too long"));
        }
        let inode = inode.to_vec();
        let kind = match r.u8()? {
            0 => SavedKind::Walked,
            1 => {
                let flags = r.u32()?;
                let count = r.u8()?;
                let locks = if count == u8::MAX {
                    None
                } else if usize::from(count) > MAX_LOCKS_PER_FID {
                    return Err(StateProblem::Malformed("too many locks"));
                } else {
                    let mut l = Vec::with_capacity(usize::from(count));
                    for _ in 0..count {
                        l.push(r.bytes16()?.to_vec());
                    }
                    Some(l)
                };
                SavedKind::Open { flags, locks }
            }
            2 => SavedKind::XattrRead(r.bytes32()?.to_vec()),
            3 => SavedKind::XattrWrite {
                name: r.bytes16()?.to_vec(),
                size: r.u32()?,
                flags: r.u32()?,
                data: r.bytes32()?.to_vec(),
            },
            _ => return Err(StateProblem::Malformed("unknown fid kind")),
        };
        Ok(SavedFid {
            fid,
            uid,
            inode,
            kind,
        })
    }
}

/// A bounds-checked reader of the body.
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], StateProblem> {
        if self.0.len() < n {
            return Err(StateProblem::Malformed("a field runs past the body"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, StateProblem> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, StateProblem> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().unwrap_or_default(),
        ))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, StateProblem> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().unwrap_or_default(),
        ))
    }

    pub(crate) fn bytes16(&mut self) -> Result<&'a [u8], StateProblem> {
        let n = usize::from(self.u16()?);
        self.take(n)
    }

    pub(crate) fn bytes32(&mut self) -> Result<&'a [u8], StateProblem> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SavedSession {
        SavedSession {
            export_id: b"export".to_vec(),
            msize: 512_000,
            fs_state: vec![1, 2, 3],
            fids: vec![
                SavedFid {
                    fid: 0,
                    uid: 0,
                    inode: b"root".to_vec(),
                    kind: SavedKind::Walked,
                },
                SavedFid {
                    fid: 7,
                    uid: 1000,
                    inode: b"a/b".to_vec(),
                    kind: SavedKind::Open {
                        flags: 2,
                        locks: Some(vec![b"lock".to_vec()]),
                    },
                },
                SavedFid {
                    fid: 8,
                    uid: 1000,
                    inode: b"c".to_vec(),
                    kind: SavedKind::Open {
                        flags: 0,
                        locks: None,
                    },
                },
                SavedFid {
                    fid: 9,
                    uid: 0,
                    inode: b"c".to_vec(),
                    kind: SavedKind::XattrRead(b"value".to_vec()),
                },
                SavedFid {
                    fid: 10,
                    uid: 0,
                    inode: b"c".to_vec(),
                    kind: SavedKind::XattrWrite {
                        name: b"user.x".to_vec(),
                        size: 8,
                        flags: 0,
                        data: b"half".to_vec(),
                    },
                },
            ],
        }
    }

    #[test]
    fn test_state_round_trips() {
        let s = sample();
        assert_eq!(SavedSession::decode(&s.encode()).unwrap(), s);
        let empty = SavedSession::default();
        assert_eq!(SavedSession::decode(&empty.encode()).unwrap(), empty);
    }

    #[test]
    fn test_state_refuses_what_is_not_state() {
        assert_eq!(SavedSession::decode(b""), Err(StateProblem::NotState));
        assert_eq!(
            SavedSession::decode(b"#!/bin/sh\necho hi\n"),
            Err(StateProblem::NotState)
        );
    }

    #[test]
    fn test_state_refuses_every_truncation() {
        let bytes = sample().encode();
        for len in MAGIC.len()..bytes.len() {
            let e = SavedSession::decode(&bytes[..len]).unwrap_err();
            assert!(matches!(e, StateProblem::Truncated { .. }), "{len}: {e:?}");
        }
    }

    #[test]
    fn test_state_refuses_every_flipped_bit_of_the_body() {
        let bytes = sample().encode();
        for i in 16..bytes.len() {
            for bit in [0x01u8, 0x80] {
                let mut b = bytes.clone();
                b[i] ^= bit;
                let e = SavedSession::decode(&b).unwrap_err();
                assert!(
                    matches!(e, StateProblem::Checksum | StateProblem::Truncated { .. }),
                    "byte {i}: {e:?}"
                );
            }
        }
    }

    #[test]
    fn test_state_refuses_other_versions() {
        let mut bytes = sample().encode();
        bytes[8..12].copy_from_slice(&9u32.to_le_bytes());
        assert_eq!(
            SavedSession::decode(&bytes),
            Err(StateProblem::Version {
                found: 9,
                expected: 2
            })
        );
        assert_eq!(
            StateProblem::Version {
                found: 9,
                expected: 2
            }
            .to_string(),
            "format version 9, this build reads version 2"
        );
    }

    #[test]
    fn test_state_with_a_valid_checksum_but_a_bad_body_is_malformed() {
        // A body whose fid count promises more than it holds, checksummed
        // as if it were good: the field bounds still catch it.
        let mut s = sample();
        s.fids.truncate(1);
        let mut bytes = s.encode();
        let count_at = 16 + 4 + s.export_id.len() + 4 + 4 + s.fs_state.len();
        bytes[count_at..count_at + 4].copy_from_slice(&5u32.to_le_bytes());
        let end = bytes.len() - 4;
        let crc = crc32fast::hash(&bytes[..end]);
        bytes[end..].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            SavedSession::decode(&bytes),
            Err(StateProblem::Malformed(_))
        ));
    }
}
