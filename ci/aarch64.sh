#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# aarch64-unknown-linux-gnu: every crate of the workspace and its tests are
# cross-built (all features, the committed Cargo.lock) in the
# Debian trixie chroot of ci/trixie/prepare.sh (rustc-web 1.96 with the
# arm64 std of the same version, gcc-aarch64-linux-gnu as the linker), and
# the unit tests and the integration tests that qemu-user can run are run
# under qemu-aarch64 (user mode; the chroot's qemu-user). What is left out
# is listed below with its reason.
# Doctests are not run for the cross target (-Z doctest-xcompile is
# unstable); they are target-independent and ci/unit-tests.sh runs them.
# First run: about 5 min for the chroot; the build took 25 min on a
# loaded 2-core machine (about 8 helpers at once). The chroot and the build are cached (the chroot under
# /var/cache/virtio-9p-ci, the build under target/trixie).
source "$(dirname "$0")/lib.sh"
bash ci/trixie/prepare.sh

# Which tests run. The unit tests (--lib --bins) of every crate, and the
# integration test targets below, which pass under qemu-user. Left out,
# measured 2026-12-06 (`ci/aarch64.sh --all` runs every target):
# - coro-pool tests/child: re-executes the test binary as a child (and
#   counts its VMAs); an aarch64 child cannot exec without binfmt_misc.
# - mem-prealloc fallback, guest_memory, hugetlb, prealloc, regions,
#   sigbus: qemu-user has no MADV_POPULATE_WRITE, mincore of guest pages,
#   hugetlbfs mappings or SIGBUS on a truncated memfd as the kernel has.
# - mlock-policy error_path, locking: mlock2 is ENOSYS under qemu-user,
#   and the tests drop capabilities in a child.
# - virtio-9p-server crash_binary, daemon_conventions, escape and the
#   other tests that start the daemon binary (a child process), set up
#   namespaces or install seccomp filters (qemu-user does not pass them
#   to the kernel); under qemu-user a run of all of them takes well over
#   the CI budget.
TESTS=(
    "-p coro-pool --test budget --test model --test pool"
    "-p mem-prealloc --test numa"
    "-p virtio-9p-server --test concurrency --test filesystem_api --test guest_log --test hostile_load"
    "-p virtqueue-large --tests"
)
# Unit tests that qemu-user cannot run, by name filter -> why.
SKIPS=(
    "region::tests::test_range_with_a_hole_is_a_region_error|mlock2(MLOCK_ONFAULT) is ENOSYS under qemu-user"
    "sys::tests::test_probe_onfault|mlock2(MLOCK_ONFAULT) is ENOSYS under qemu-user"
)
all=0
[ "${1:-}" = --all ] && all=1
skip_args=()
echo "aarch64: unit tests skipped under qemu-user:"
for s in "${SKIPS[@]}"; do
    echo "  ${s%%|*}: ${s#*|}"
    skip_args+=(--skip "${s%%|*}")
done

cross() {
    ci/trixie/run.sh env CARGO_TARGET_DIR=/src/target/trixie \
        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=qemu-aarch64 \
        CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
        cargo "$1" --all-features --locked --target aarch64-unknown-linux-gnu "${@:2}"
}

# Every library and binary builds (the tests below build the test
# targets; `--all` builds them all). Examples and benches are left to the
# x86_64 steps to keep CI in its budget.
cross build --workspace
if [ $all = 1 ]; then
    cross test --workspace --no-fail-fast --lib --bins --tests -- "${skip_args[@]}"
    exit
fi
cross test --workspace --no-fail-fast --lib --bins -- "${skip_args[@]}"
rc=0
for t in "${TESTS[@]}"; do
    # shellcheck disable=SC2086 # one line holds several arguments
    cross test --no-fail-fast $t || rc=1
done
exit $rc
