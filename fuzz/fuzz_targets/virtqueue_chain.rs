// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `virtqueue_chain`: descriptors and queue operations, laid out through
//! virtqueue-large's mock driver (valid, raw and malicious chains, a
//! corrupted available index, pops, used-ring reclaim) and replayed under
//! the spec-strict policy, the large policy and a variant chosen by the
//! input. The input format and the invariants live in
//! `virtqueue_large::fuzzing`: limits hold, segments lie in guest memory
//! and add up, Reader/Writer transfer exactly the chain's bytes,
//! virtio-queue's own iterator sees the same descriptors, refused chains
//! are consumed and ring-level errors consume nothing. Its unit tests run
//! the seed corpus (`fuzzing::seeds`).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    virtqueue_large::fuzzing::run(data);
});
