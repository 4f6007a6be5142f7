// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Structured fuzz inputs for the vmm-io-crates fuzz targets, and the seed
//! corpora written by this crate's unit tests.
//!
//! Each target in `fuzz/fuzz_targets` decodes its libFuzzer bytes with one
//! of these types (or, for `virtqueue_chain`, with virtqueue-large's own
//! `fuzzing` module). The decoding is total: any bytes give a valid input
//! ([`bytes::ByteSource`] reads zeros past the end), so mutations explore
//! the code under test instead of the harness. Each type also encodes, so
//! the unit tests build seeds from typed values, check that they decode
//! back unchanged, and write them to `fuzz/corpus/<target>/`.
//!
//! - `p9_session`: [`p9::SessionInput`].
//! - `virtio_device`: [`device::DeviceInput`].
//! - `p9_decode`: takes raw bytes; seeds from [`p9::decode_seeds`].
//! - `id_options`: takes text; [`ids::check`] parses it, seeds from
//!   [`ids::SEEDS`].
//! - [`sandbox::Sandbox`]: the export (and the canary beside it) that
//!   `p9_session` and `virtio_device` serve.
//! - `virtqueue_chain`: `virtqueue_large::fuzzing::run` decodes the bytes;
//!   this crate only writes `virtqueue_large::fuzzing::seeds()` to its
//!   corpus.
//! - `virtqueue_packed`: likewise with `virtqueue_large::fuzzing::packed`.
//!
//! ```
//! use vmm_fuzz_common::p9::SessionInput;
//!
//! // Any bytes decode; the encoding gives the same input back.
//! let input = SessionInput::decode(&[0x02, 0x03, 0x00, 0x00, 0x0b, 0x01]);
//! assert_eq!(input.frames.len(), 1);
//! assert_eq!(SessionInput::decode(&input.encode()), input);
//! ```

pub mod bytes;
pub mod corpus;
pub mod device;
pub mod ids;
pub mod p9;
pub mod sandbox;

#[cfg(test)]
mod tests {
    /// Writes `seeds` as `target`'s corpus, named by their index, and
    /// checks that every one was written.
    fn write_numbered(target: &str, seeds: Vec<Vec<u8>>) {
        let named: Vec<(String, Vec<u8>)> = seeds
            .into_iter()
            .enumerate()
            .map(|(i, s)| (format!("{i:03}"), s))
            .collect();
        let n = crate::corpus::write(target, named.iter().map(|(n, s)| (n.as_str(), s.clone())));
        assert_eq!(n, named.len());
    }

    #[test]
    fn test_virtqueue_chain_seeds_are_written() {
        let seeds = virtqueue_large::fuzzing::seeds();
        assert!(!seeds.is_empty());
        write_numbered("virtqueue_chain", seeds);
    }

    #[test]
    fn test_virtqueue_packed_seeds_are_written() {
        let seeds = virtqueue_large::fuzzing::packed::seeds();
        assert!(seeds.len() > virtqueue_large::mock::PackedMalicious::ALL.len());
        write_numbered("virtqueue_packed", seeds);
    }
}
