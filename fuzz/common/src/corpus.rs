// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Writes seed files into the cargo-fuzz corpus directories.

use std::path::PathBuf;

/// The corpus directory of `target`: `fuzz/corpus/<target>` (the directory
/// `cargo fuzz run` reads and extends; it is not committed, the unit tests
/// of this crate regenerate the seeds).
pub fn dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("corpus")
        .join(target)
}

/// Writes each `(name, bytes)` as `seed-<name>` into the corpus of `target`
/// and returns how many were written. Panics on I/O errors (it runs in
/// tests).
pub fn write<'a>(target: &str, seeds: impl IntoIterator<Item = (&'a str, Vec<u8>)>) -> usize {
    let dir = dir(target);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    let mut n = 0;
    for (name, bytes) in seeds {
        let path = dir.join(format!("seed-{name}"));
        std::fs::write(&path, &bytes).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        n += 1;
    }
    n
}
