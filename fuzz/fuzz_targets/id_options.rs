// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Text into the `--uid-map` / `--gid-map` and `--translate-uid` /
//! `--translate-gid` parsers of virtio-9p-server: no panic, parsed rules
//! print back to themselves, accepted rule sets translate every id.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        vmm_fuzz_common::ids::check(text);
    }
});
