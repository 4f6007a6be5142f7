// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Pages whose CPU access would raise SIGBUS (a memfd truncated below its
//! mapping) give an error under every method, and the process carries on.

mod common;

use common::{memfd, Mapping, MIB};
use mem_prealloc::{preallocate, Error, Method, PreallocOptions};

#[test]
fn test_truncated_memfd_is_an_error_not_sigbus() {
    for method in [Method::Auto, Method::PopulateWrite, Method::Touch] {
        let len = 16 * MIB;
        let file = memfd("truncated", len, 0).unwrap();
        let map = Mapping::shared(&file, len);
        // Shrink the file: the second half of the mapping is beyond EOF, where
        // a CPU access raises SIGBUS.
        file.set_len((len / 2) as u64).unwrap();
        let opts = PreallocOptions::new().threads(2).method(method);
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let err = unsafe { preallocate(map.addr, len, &opts) }.unwrap_err();
        let Error::Fault { offset, ref source } = err else {
            panic!("{method}: {err}");
        };
        assert_eq!(offset, (len / 2) as u64, "{method}");
        assert_eq!(source.raw_os_error(), Some(libc::EFAULT), "{method}");
        assert!(
            err.to_string().contains("an access would raise SIGBUS"),
            "{err}"
        );
        // The first half, inside the file, is usable and was faulted in.
        assert_eq!(map.as_slice()[len / 2 - 1], 0);
    }
}
