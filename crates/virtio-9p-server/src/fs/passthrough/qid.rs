//! Qid paths unique across the host devices under one export (the idea of
//! QEMU's `multidevs=remap`).
//!
//! Inode numbers repeat across filesystems, so `(dev, ino)` is folded into
//! 64 bits: files on the export's own device keep their inode number; each
//! further device gets a 15-bit prefix placed in bits 48..63, so its inodes
//! become `prefix << 48 | ino`. An inode number that does not fit 48 bits,
//! or a device beyond the 32767 prefixes, gets a sequential path with bit 63
//! set from an exact `(dev, ino)` table. Paths therefore never collide.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

const INO_BITS: u32 = 48;
const INO_MASK: u64 = (1 << INO_BITS) - 1;
const MAX_PREFIX: u64 = 0x7fff;
const EXACT_BIT: u64 = 1 << 63;

/// Maps `(dev, ino)` to qid paths.
#[derive(Debug)]
pub struct QidMap {
    root_dev: u64,
    prefixes: RwLock<HashMap<u64, u64>>,
    exact: Mutex<HashMap<(u64, u64), u64>>,
    next_exact: AtomicU64,
}

impl QidMap {
    /// A map whose unprefixed device is `root_dev`.
    pub fn new(root_dev: u64) -> Self {
        QidMap {
            root_dev,
            prefixes: RwLock::new(HashMap::new()),
            exact: Mutex::new(HashMap::new()),
            next_exact: AtomicU64::new(1),
        }
    }

    /// Whether more than one device has been seen.
    pub fn multi_device(&self) -> bool {
        !self
            .prefixes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// The qid path of `(dev, ino)`.
    pub fn path(&self, dev: u64, ino: u64) -> u64 {
        if ino <= INO_MASK {
            if dev == self.root_dev {
                return ino;
            }
            if let Some(p) = self.prefix(dev) {
                return (p << INO_BITS) | ino;
            }
        }
        let mut exact = self.exact.lock().unwrap_or_else(|e| e.into_inner());
        *exact
            .entry((dev, ino))
            .or_insert_with(|| EXACT_BIT | self.next_exact.fetch_add(1, Ordering::Relaxed))
    }

    fn prefix(&self, dev: u64) -> Option<u64> {
        if let Some(p) = self
            .prefixes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&dev)
        {
            return Some(*p);
        }
        let mut map = self.prefixes.write().unwrap_or_else(|e| e.into_inner());
        let next = map.len() as u64 + 1;
        if let Some(p) = map.get(&dev) {
            return Some(*p);
        }
        if next > MAX_PREFIX {
            return None;
        }
        map.insert(dev, next);
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_qid_paths_unique_across_devices() {
        let m = QidMap::new(1);
        assert_eq!(m.path(1, 42), 42);
        let other = m.path(2, 42);
        assert_ne!(other, 42);
        assert_eq!(m.path(2, 42), other);
        assert!(m.multi_device());
        let big = m.path(1, 1 << 50);
        assert_ne!(big & EXACT_BIT, 0);
        assert_eq!(m.path(1, 1 << 50), big);
        assert_ne!(m.path(3, 1 << 50), big);
    }

    #[test]
    fn test_qid_prefix_exhaustion_falls_back_to_exact() {
        let m = QidMap::new(0);
        let mut seen = std::collections::HashSet::new();
        for dev in 1..=(MAX_PREFIX + 10) {
            assert!(seen.insert(m.path(dev, 7)), "collision at dev {dev}");
        }
    }
}
