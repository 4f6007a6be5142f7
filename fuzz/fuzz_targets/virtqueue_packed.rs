// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `virtqueue_packed`: driver and device operations on one packed ring,
//! laid out through virtqueue-large's `MockPackedDriver` (valid chains with
//! driver-chosen buffer ids, raw descriptors with raw AVAIL/USED bits,
//! every `PackedMalicious` pattern, driver event suppression values, ring
//! bases) and served by `PackedQueue` (`DeviceRing::pop_chain`), under
//! the spec-strict policy, the large policy and a variant chosen by the
//! input. The input format and the invariants live in
//! `virtqueue_large::fuzzing::packed`; its unit tests run the seed corpus.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    virtqueue_large::fuzzing::packed::run(data);
});
