// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Qid paths unique across the host devices under one export (the idea of
//! QEMU's `multidevs=remap`, with its suffix map and full map).
//!
//! Inode numbers repeat across filesystems, so `(dev, ino)` is folded into
//! 64 bits: files on the export's own device whose inode number fits 48
//! bits keep it. Every other `(dev, ino >> 48)` pair gets a 15-bit prefix
//! placed in bits 48..63, so its inodes become `prefix << 48 | (ino & mask)`
//! (QEMU's `qid_path_suffixmap`: the high bits of large inode numbers
//! cluster, so few prefixes are needed). Once the 32767 prefixes are gone,
//! `(dev, ino)` gets a sequential path with bit 63 set from an exact table
//! (QEMU's `qid_path_fullmap`). Paths therefore never collide.
//!
//! Memory is bounded: at most [`MAX_PREFIX`] prefixes and
//! [`DEFAULT_MAX_EXACT`] exact entries. A file that needs an exact entry
//! when the table is full gets `ENFILE` (as QEMU does when its maps run
//! out) and everything already mapped keeps its path.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};

use log::error;

const INO_BITS: u32 = 48;
const INO_MASK: u64 = (1 << INO_BITS) - 1;
/// Prefixes available for `(dev, ino >> 48)` pairs other than the root
/// device's low inodes.
pub const MAX_PREFIX: u64 = 0x7fff;
const EXACT_BIT: u64 = 1 << 63;
/// Default cap on exact `(dev, ino)` entries (about 12 MiB of table).
pub const DEFAULT_MAX_EXACT: usize = 1 << 18;

/// Maps `(dev, ino)` to qid paths.
#[derive(Debug)]
pub struct QidMap {
    root_dev: u64,
    prefixes: RwLock<HashMap<(u64, u64), u64>>,
    exact: Mutex<HashMap<(u64, u64), u64>>,
    max_exact: usize,
    other_device: AtomicBool,
    warned: AtomicBool,
}

impl QidMap {
    /// A map whose unprefixed device is `root_dev`, with the default cap.
    pub fn new(root_dev: u64) -> Self {
        Self::with_max_exact(root_dev, DEFAULT_MAX_EXACT)
    }

    /// A map holding at most `max_exact` exact entries.
    pub fn with_max_exact(root_dev: u64, max_exact: usize) -> Self {
        QidMap {
            root_dev,
            prefixes: RwLock::new(HashMap::new()),
            exact: Mutex::new(HashMap::new()),
            max_exact,
            other_device: AtomicBool::new(false),
            warned: AtomicBool::new(false),
        }
    }

    /// Whether more than one device has been seen.
    pub fn multi_device(&self) -> bool {
        self.other_device.load(Ordering::Acquire)
    }

    /// Entries in the exact table.
    #[cfg(test)]
    pub fn exact_entries(&self) -> usize {
        self.exact.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The qid path of `(dev, ino)`; `ENFILE` when it needs an exact entry
    /// and the exact table is full.
    pub fn path(&self, dev: u64, ino: u64) -> io::Result<u64> {
        if dev != self.root_dev && !self.other_device.load(Ordering::Relaxed) {
            self.other_device.store(true, Ordering::Release);
        }
        let hi = ino >> INO_BITS;
        if dev == self.root_dev && hi == 0 {
            return Ok(ino);
        }
        if let Some(p) = self.prefix(dev, hi) {
            return Ok((p << INO_BITS) | (ino & INO_MASK));
        }
        let mut exact = self.exact.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = exact.get(&(dev, ino)) {
            return Ok(*p);
        }
        if exact.len() >= self.max_exact {
            if !self.warned.swap(true, Ordering::Relaxed) {
                error!(
                    "9p: qid table full ({} exact entries): new files with large inode numbers get ENFILE",
                    self.max_exact
                );
            }
            return Err(io::Error::from_raw_os_error(libc::ENFILE));
        }
        // Sequential from 1: never reused, so never a collision.
        let p = EXACT_BIT | (exact.len() as u64 + 1);
        exact.insert((dev, ino), p);
        Ok(p)
    }

    /// The tables as bytes, for a restart (empty when only the root
    /// device's low inodes were seen: their paths need no table).
    pub fn save(&self) -> Vec<u8> {
        let prefixes = self.prefixes.read().unwrap_or_else(|e| e.into_inner());
        let exact = self.exact.lock().unwrap_or_else(|e| e.into_inner());
        if prefixes.is_empty() && exact.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(8 + 24 * (prefixes.len() + exact.len()));
        for table in [&*prefixes, &*exact] {
            out.extend_from_slice(&(table.len() as u32).to_le_bytes());
            for ((a, b), p) in table.iter() {
                for v in [*a, *b, *p] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        out
    }

    /// Takes back the tables [`QidMap::save`] wrote, so every file keeps
    /// its qid path across a restart. `EINVAL` for bytes it did not write.
    pub fn restore(&self, saved: &[u8]) -> io::Result<()> {
        if saved.is_empty() {
            return Ok(());
        }
        let bad = || io::Error::from_raw_os_error(libc::EINVAL);
        let mut r = saved;
        let mut tables: [HashMap<(u64, u64), u64>; 2] = Default::default();
        for (i, t) in tables.iter_mut().enumerate() {
            let n = u32::from_le_bytes(r.get(..4).ok_or_else(bad)?.try_into().map_err(|_| bad())?)
                as usize;
            r = &r[4..];
            let cap = if i == 0 {
                MAX_PREFIX as usize
            } else {
                self.max_exact
            };
            if n > cap || r.len() < n * 24 {
                return Err(bad());
            }
            for chunk in r[..n * 24].chunks_exact(24) {
                let v = |k: usize| {
                    u64::from_le_bytes(chunk[k * 8..k * 8 + 8].try_into().unwrap_or_default())
                };
                t.insert((v(0), v(1)), v(2));
            }
            r = &r[n * 24..];
        }
        if !r.is_empty() {
            return Err(bad());
        }
        let [prefixes, exact] = tables;
        if !exact.is_empty() || !prefixes.is_empty() {
            self.other_device.store(true, Ordering::Release);
        }
        *self.prefixes.write().unwrap_or_else(|e| e.into_inner()) = prefixes;
        *self.exact.lock().unwrap_or_else(|e| e.into_inner()) = exact;
        Ok(())
    }

    fn prefix(&self, dev: u64, hi: u64) -> Option<u64> {
        let key = (dev, hi);
        if let Some(p) = self
            .prefixes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Some(*p);
        }
        let mut map = self.prefixes.write().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = map.get(&key) {
            return Some(*p);
        }
        let next = map.len() as u64 + 1;
        if next > MAX_PREFIX {
            return None;
        }
        map.insert(key, next);
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_qid_paths_unique_across_devices() {
        let m = QidMap::new(1);
        assert_eq!(m.path(1, 42).unwrap(), 42);
        let other = m.path(2, 42).unwrap();
        assert_ne!(other, 42);
        assert_eq!(m.path(2, 42).unwrap(), other);
        assert!(m.multi_device());
        let big = m.path(1, 1 << 50).unwrap();
        assert_ne!(big, 1 << 50);
        assert_eq!(m.path(1, 1 << 50).unwrap(), big);
        assert_ne!(m.path(3, 1 << 50).unwrap(), big);
    }

    #[test]
    fn test_qid_large_inodes_share_prefixes() {
        // Inode numbers above 2^48 with the same high bits cost one prefix,
        // not one table entry each.
        let m = QidMap::with_max_exact(1, 0);
        let mut seen = std::collections::HashSet::new();
        for ino in 0..10_000u64 {
            assert!(seen.insert(m.path(1, (7 << 48) | ino).unwrap()));
        }
        assert_eq!(m.exact_entries(), 0);
        assert!(!m.multi_device());
    }

    #[test]
    fn test_qid_prefix_exhaustion_falls_back_to_exact() {
        let m = QidMap::new(0);
        let mut seen = std::collections::HashSet::new();
        for dev in 1..=(MAX_PREFIX + 10) {
            assert!(
                seen.insert(m.path(dev, 7).unwrap()),
                "collision at dev {dev}"
            );
        }
        assert_eq!(m.exact_entries(), 10);
    }

    #[test]
    fn test_qid_exact_table_is_bounded() {
        let m = QidMap::with_max_exact(0, 4);
        for dev in 1..=MAX_PREFIX {
            m.path(dev, 1).unwrap();
        }
        // Random-looking 64-bit inodes on yet another device: exact entries.
        let inos: Vec<u64> = (1..=4u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let paths: Vec<u64> = inos.iter().map(|&i| m.path(99_999, i).unwrap()).collect();
        let e = m.path(99_999, 12345).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENFILE));
        assert_eq!(m.exact_entries(), 4);
        // What is mapped keeps its path.
        for (i, p) in inos.iter().zip(&paths) {
            assert_eq!(m.path(99_999, *i).unwrap(), *p);
        }
        assert_eq!(m.path(0, 5).unwrap(), 5);
    }
}
