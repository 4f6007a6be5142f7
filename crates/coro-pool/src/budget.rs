// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The mapping budget: how many stacks a pool may hold before it would push
//! the process towards `vm.max_map_count`.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::stack::GuardKind;

/// The kernel's default `vm.max_map_count` (`DEFAULT_MAX_MAP_COUNT`), assumed
/// when `/proc/sys/vm/max_map_count` cannot be read (for example under an
/// AppArmor profile that hides it). Assuming the default is safe: raising the
/// sysctl is the only common change, and it only makes the real limit larger.
pub const FALLBACK_MAX_MAP_COUNT: u64 = 65_530;

/// VMAs left for everything else in the process (libraries, thread stacks,
/// malloc arenas, guest memory regions, vhost-user mappings), as in QEMU.
pub const DEFAULT_VMA_RESERVE: u64 = 5_000;

/// Where `/proc/sys/vm/max_map_count` lives.
pub const MAX_MAP_COUNT_PATH: &str = "/proc/sys/vm/max_map_count";

/// Where a pool learns `vm.max_map_count`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MaxMapCount {
    /// Read [`MAX_MAP_COUNT_PATH`] the first time the budget is needed.
    Proc,
    /// Read this file instead (tests, containers with a different layout).
    File(PathBuf),
    /// Use this value; nothing is read.
    Fixed(u64),
}

impl MaxMapCount {
    /// Resolves the source now: the value, read from its file if it names
    /// one. A process that is about to lose `/proc` (a sandbox: `chroot`,
    /// `pivot_root`, a procfs mounted with `subset=pid`) reads the limit
    /// here and hands it in as [`MaxMapCount::Fixed`].
    pub fn read(&self) -> io::Result<u64> {
        let path = match self {
            MaxMapCount::Fixed(v) => return Ok(*v),
            MaxMapCount::Proc => Path::new(MAX_MAP_COUNT_PATH),
            MaxMapCount::File(path) => path.as_path(),
        };
        std::fs::read_to_string(path)?
            .trim()
            .parse::<u64>()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

/// Where a budget counts the process's mappings.
#[derive(Debug)]
#[non_exhaustive]
pub enum MapsSource {
    /// Open `/proc/self/maps` at every count.
    Proc,
    /// An fd of this process's `/proc/self/maps`, kept open and read from
    /// its start at every count (`pread`, no `open`). For a process that
    /// loses `/proc` after the budget is made (a sandbox, a seccomp filter
    /// without `openat`): open it with [`MapsSource::open`] before, and the
    /// count stays exact inside. The fd describes the process that opened
    /// it: after a `fork`, the child must open its own.
    Fd(OwnedFd),
}

impl MapsSource {
    /// Opens `/proc/self/maps` now: a [`MapsSource::Fd`].
    pub fn open() -> io::Result<MapsSource> {
        let file = std::fs::File::open("/proc/self/maps")?;
        Ok(MapsSource::Fd(file.into()))
    }

    fn fd(&self) -> Option<RawFd> {
        match self {
            MapsSource::Proc => None,
            MapsSource::Fd(fd) => Some(fd.as_raw_fd()),
        }
    }
}

/// Where a budget's `max_map_count` came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BudgetOrigin {
    /// Read from the sysctl file.
    Read,
    /// Given in the configuration.
    Injected,
    /// The file could not be read or parsed: [`FALLBACK_MAX_MAP_COUNT`].
    Fallback,
}

/// The mapping budget as one pool sees it.
///
/// `max_stacks = min(share, limit_vmas / vmas_per_stack)`, where
/// `limit_vmas` is the process-wide limit of the pool's [`ProcessBudget`]:
/// `max_map_count - reserve` (less the foreign mappings beyond half the
/// reserve), the reserve being the configured one (5000 by default, as
/// QEMU) but at most half of `max_map_count`, so that a tiny limit still
/// leaves some stacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MapBudget {
    /// The `vm.max_map_count` the budget is based on.
    pub max_map_count: u64,
    /// Where that value came from.
    pub origin: BudgetOrigin,
    /// VMAs kept free for the rest of the process.
    pub reserved_vmas: u64,
    /// VMAs one stack costs (1 with `MADV_GUARD_INSTALL`, 2 with `mprotect`).
    pub vmas_per_stack: usize,
    /// Stacks the pool may hold in total (running and idle) if it had the
    /// budget to itself: the process-wide limit in stacks, capped by the
    /// pool's share. Other pools drawing on the same budget leave it less.
    pub max_stacks: usize,
    /// VMAs all pools of the budget may hold together now (see
    /// [`ProcessBudget`]).
    pub limit_vmas: u64,
    /// The pool's own cap in stacks, if it was given one
    /// ([`PoolConfig::budget_share`](crate::PoolConfig::budget_share)).
    pub share: Option<usize>,
}

impl MapBudget {
    /// Computes a budget. `max_map_count` is `None` when it could not be
    /// read; the documented fallback is used then, never "unbounded".
    pub fn compute(max_map_count: Option<u64>, reserve: u64, guard: GuardKind) -> MapBudget {
        Self::compute_with_origin(
            max_map_count.map(|v| (v, BudgetOrigin::Read)),
            reserve,
            guard,
        )
    }

    pub(crate) fn compute_with_origin(
        value: Option<(u64, BudgetOrigin)>,
        reserve: u64,
        guard: GuardKind,
    ) -> MapBudget {
        let (max_map_count, origin) =
            value.unwrap_or((FALLBACK_MAX_MAP_COUNT, BudgetOrigin::Fallback));
        let reserved_vmas = reserve.min(max_map_count / 2);
        let vmas_per_stack = guard.vmas_per_stack();
        let stacks = (max_map_count - reserved_vmas) / vmas_per_stack as u64;
        MapBudget {
            max_map_count,
            origin,
            reserved_vmas,
            vmas_per_stack,
            max_stacks: usize::try_from(stacks).unwrap_or(usize::MAX),
            limit_vmas: max_map_count - reserved_vmas,
            share: None,
        }
    }
}

/// Resolves a [`MaxMapCount`] source to a value and its origin, or `None`
/// when a file cannot be read or parsed (logged as a warning).
pub(crate) fn resolve(source: &MaxMapCount) -> Option<(u64, BudgetOrigin)> {
    match source {
        MaxMapCount::Fixed(v) => Some((*v, BudgetOrigin::Injected)),
        MaxMapCount::Proc => read_file(Path::new(MAX_MAP_COUNT_PATH)),
        MaxMapCount::File(path) => read_file(path),
    }
}

fn read_file(path: &Path) -> Option<(u64, BudgetOrigin)> {
    match std::fs::read_to_string(path) {
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(v) => Some((v, BudgetOrigin::Read)),
            Err(e) => {
                log::warn!(
                    "coro-pool: cannot parse {}: {e}; assuming vm.max_map_count = {FALLBACK_MAX_MAP_COUNT}",
                    path.display()
                );
                None
            }
        },
        Err(e) => {
            log::warn!(
                "coro-pool: cannot read {}: {e}; assuming vm.max_map_count = {FALLBACK_MAX_MAP_COUNT}",
                path.display()
            );
            None
        }
    }
}

/// VMAs of growth between two rereads of `/proc/self/maps` while the
/// budget runs low: a sixteenth of the reserve, at least this many.
const MIN_MEASURE_STEP: u64 = 16;

/// Bytes read from `/proc/self/maps` at a time. The buffer is allocated
/// with the budget, so counting needs no allocation and no stack space
/// (it may run on a small coroutine stack, near the mapping limit).
const MAPS_BUF: usize = 16 << 10;

/// The mapping budget every pool of a process draws from.
///
/// `vm.max_map_count` limits a whole process, so the stacks of all pools
/// count against one figure: pools together may hold at most
/// `max_map_count - reserve - max(0, foreign - reserve / 2)` VMAs, where
/// `reserve` (default [`DEFAULT_VMA_RESERVE`], at most half of
/// `max_map_count`) is left to the rest of the process and `foreign` is
/// the number of the process's mappings that no pool holds, as last
/// measured in `/proc/self/maps`. The reserve covers other mappings up to
/// half of it; beyond that every further mapping of the rest of the process
/// shrinks the pools' budget by one, so at least half the reserve always
/// stays free for the process to grow into.
///
/// [`ProcessBudget::process`] is the process default, which every pool
/// uses unless its [`PoolConfig`](crate::PoolConfig) names another. It is
/// the crate's one piece of process-global state, on purpose: the limit it
/// guards is per process. A separate budget ([`ProcessBudget::new`]) is for
/// tests and for embedders that split the limit themselves.
///
/// A process that loses `/proc` (a sandbox) hands the figures in instead:
/// it reads the limit ([`MaxMapCount::read`]) and opens its maps
/// ([`MapsSource::open`]) before, and installs a budget made of them with
/// [`ProcessBudget::with_maps`] and [`ProcessBudget::set_process`] before
/// any pool is made. The count stays exact inside, and nothing is logged.
///
/// What is counted is what the pools have mapped: every stack is charged
/// when its `mmap` and guard succeed and released when it is unmapped, at 2
/// VMAs per `mprotect`-guarded stack (exact) and 1 per guard-installed
/// stack (an upper bound: adjacent ones merge). The count of foreign
/// mappings is refreshed when a pool is created, at every trim, whenever
/// the pools have taken a quarter of the remaining headroom (at least a
/// sixteenth of the reserve) since the last count, so ever more often as
/// the budget runs low, and before a request is refused.
/// Each measurement also checks the accounting: if `/proc/self/maps` lists
/// fewer VMAs than the `mprotect`-guarded stacks alone must occupy, the
/// accounting has drifted and a warning is logged.
#[derive(Debug)]
pub struct ProcessBudget {
    source: MaxMapCount,
    reserve: u64,
    measure_foreign: bool,
    maps: MapsSource,
    mmc: OnceLock<Option<(u64, BudgetOrigin)>>,
    /// VMAs of `mprotect`-guarded stacks (exactly 2 per stack).
    exact_vmas: AtomicU64,
    /// VMAs of guard-installed stacks (at most 1 per stack).
    upper_vmas: AtomicU64,
    /// Mappings no pool holds, at the last measurement.
    foreign: AtomicU64,
    /// Lines of `/proc/self/maps` at the last measurement (0: none yet).
    measured: AtomicU64,
    /// Pool VMAs at the last measurement.
    measured_at: AtomicU64,
    measurements: AtomicU64,
    drift_warnings: AtomicU64,
    over_reserve: AtomicBool,
    /// `/proc/self/maps` could not be read at the last try (logged once).
    maps_unreadable: AtomicBool,
    buf: Mutex<Box<[u8]>>,
}

/// What one check of the budget against `/proc/self/maps` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BudgetCheck {
    /// Lines of `/proc/self/maps`: every VMA of the process.
    pub process_vmas: u64,
    /// VMAs the pools account for (all pools of this budget).
    pub pool_vmas: u64,
    /// The part of `pool_vmas` that is exact (`mprotect`-guarded stacks).
    pub exact_pool_vmas: u64,
    /// Mappings no pool holds: `process_vmas - pool_vmas`.
    pub foreign_vmas: u64,
    /// The accounting disagrees with the kernel: fewer VMAs exist than the
    /// exact part alone needs. Logged as a warning.
    pub drifted: bool,
}

/// A snapshot of a [`ProcessBudget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct BudgetStats {
    /// The `vm.max_map_count` used (0 until it is first needed).
    pub max_map_count: u64,
    /// VMAs left to the rest of the process.
    pub reserved_vmas: u64,
    /// VMAs all pools together may hold now.
    pub limit_vmas: u64,
    /// VMAs all pools together hold.
    pub pool_vmas: u64,
    /// Mappings no pool holds, at the last measurement.
    pub foreign_vmas: u64,
    /// Lines of `/proc/self/maps` at the last measurement (0: none yet).
    pub measured_process_vmas: u64,
    /// Measurements of `/proc/self/maps` so far.
    pub measurements: u64,
    /// Measurements that found the accounting drifted.
    pub drift_warnings: u64,
}

impl ProcessBudget {
    /// A budget of its own, not shared with the process default. It reads
    /// `vm.max_map_count` from `source` on first use and leaves `reserve`
    /// VMAs to the rest of the process. Foreign mappings are measured
    /// against the limit only for [`MaxMapCount::Proc`] (an injected limit
    /// is a simulated one); [`ProcessBudget::measure_foreign`] changes that.
    pub fn new(source: MaxMapCount, reserve: u64) -> Arc<ProcessBudget> {
        Arc::new(Self::build(source, reserve))
    }

    fn build(source: MaxMapCount, reserve: u64) -> ProcessBudget {
        ProcessBudget {
            measure_foreign: source == MaxMapCount::Proc,
            source,
            reserve,
            maps: MapsSource::Proc,
            mmc: OnceLock::new(),
            exact_vmas: AtomicU64::new(0),
            upper_vmas: AtomicU64::new(0),
            foreign: AtomicU64::new(0),
            measured: AtomicU64::new(0),
            measured_at: AtomicU64::new(0),
            measurements: AtomicU64::new(0),
            drift_warnings: AtomicU64::new(0),
            over_reserve: AtomicBool::new(false),
            maps_unreadable: AtomicBool::new(false),
            buf: Mutex::new(vec![0u8; MAPS_BUF].into_boxed_slice()),
        }
    }

    /// Like [`ProcessBudget::new`], with foreign mappings counted against
    /// the limit (`true`) or not, whatever the source.
    pub fn measure_foreign(source: MaxMapCount, reserve: u64, on: bool) -> Arc<ProcessBudget> {
        let mut b = Self::build(source, reserve);
        b.measure_foreign = on;
        Arc::new(b)
    }

    /// A budget that counts the process's mappings through `maps` and
    /// measures them against the limit whatever `source` is: the limit and
    /// the mappings handed in by a process that loses `/proc` after this
    /// call, for example
    ///
    /// ```no_run
    /// use coro_pool::{MapsSource, MaxMapCount, ProcessBudget, DEFAULT_VMA_RESERVE};
    ///
    /// // Before the sandbox hides /proc.
    /// let limit = MaxMapCount::Proc.read()?;
    /// let maps = MapsSource::open()?;
    /// // ... chroot, pivot_root, seccomp ...
    /// let budget =
    ///     ProcessBudget::with_maps(MaxMapCount::Fixed(limit), DEFAULT_VMA_RESERVE, maps);
    /// // Every pool that names no budget of its own draws from it.
    /// assert!(ProcessBudget::set_process(budget).is_ok());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn with_maps(source: MaxMapCount, reserve: u64, maps: MapsSource) -> Arc<ProcessBudget> {
        let mut b = Self::build(source, reserve);
        b.measure_foreign = true;
        b.maps = maps;
        Arc::new(b)
    }

    fn process_cell() -> &'static OnceLock<Arc<ProcessBudget>> {
        static PROCESS: OnceLock<Arc<ProcessBudget>> = OnceLock::new();
        &PROCESS
    }

    /// The process default: `/proc/sys/vm/max_map_count` (read on first
    /// use) minus [`DEFAULT_VMA_RESERVE`], foreign mappings counted from
    /// `/proc/self/maps`, unless the program installed another one first
    /// ([`ProcessBudget::set_process`]). Made on first call; every pool
    /// whose configuration names no other budget draws from it,
    /// [`StackPool::global`](crate::StackPool::global) included.
    pub fn process() -> &'static Arc<ProcessBudget> {
        Self::process_cell()
            .get_or_init(|| Arc::new(Self::build(MaxMapCount::Proc, DEFAULT_VMA_RESERVE)))
    }

    /// Makes `budget` the process default, for the program (not a library)
    /// to call before any pool is made: typically a budget from
    /// [`ProcessBudget::with_maps`] whose limit and maps fd were taken
    /// before a sandbox hid `/proc`. Fails, handing `budget` back, once the
    /// default exists (a pool was made, or [`ProcessBudget::process`] was
    /// called).
    pub fn set_process(budget: Arc<ProcessBudget>) -> Result<(), Arc<ProcessBudget>> {
        Self::process_cell().set(budget)
    }

    /// The `vm.max_map_count` figure and its origin (read on first use).
    pub(crate) fn max_map_count(&self) -> (u64, BudgetOrigin) {
        self.mmc
            .get_or_init(|| resolve(&self.source))
            .unwrap_or((FALLBACK_MAX_MAP_COUNT, BudgetOrigin::Fallback))
    }

    /// The reserve actually kept: at most half of `max_map_count`.
    pub(crate) fn reserved_vmas(&self) -> u64 {
        self.reserve.min(self.max_map_count().0 / 2)
    }

    /// VMAs all pools together may hold now.
    pub fn limit_vmas(&self) -> u64 {
        let mmc = self.max_map_count().0;
        let reserve = self.reserved_vmas();
        let over = if self.measure_foreign {
            self.foreign
                .load(Ordering::Relaxed)
                .saturating_sub(reserve / 2)
        } else {
            0
        };
        mmc.saturating_sub(reserve).saturating_sub(over)
    }

    /// VMAs all pools together hold.
    pub fn pool_vmas(&self) -> u64 {
        self.exact_vmas.load(Ordering::Relaxed) + self.upper_vmas.load(Ordering::Relaxed)
    }

    fn counter(&self, exact: bool) -> &AtomicU64 {
        if exact {
            &self.exact_vmas
        } else {
            &self.upper_vmas
        }
    }

    /// Charges `vmas` for a stack about to be mapped. With `enforce`, fails
    /// (charging nothing) when that would exceed the limit; the foreign
    /// count is refreshed first when the budget runs low.
    pub(crate) fn charge(&self, vmas: u64, exact: bool, enforce: bool) -> bool {
        let counter = self.counter(exact);
        counter.fetch_add(vmas, Ordering::Relaxed);
        if !enforce {
            return true;
        }
        let used = self.pool_vmas();
        let reserve = self.reserved_vmas();
        let step = (reserve / 16).max(MIN_MEASURE_STEP);
        let mut limit = self.limit_vmas();
        // Reread the process's map count after a quarter of the remaining
        // headroom has been taken since the last count (at least `step`
        // VMAs): a few counts on the way up, more as the limit nears.
        let grown = used.abs_diff(self.measured_at.load(Ordering::Relaxed));
        if self.measure_foreign && grown >= step.max(limit.saturating_sub(used) / 4) {
            self.check();
            limit = self.limit_vmas();
        }
        if used > limit && self.measure_foreign {
            // About to refuse: make sure the figure is current, unless it
            // was taken at (nearly) this very level.
            if used.abs_diff(self.measured_at.load(Ordering::Relaxed)) >= (step / 8).max(1) {
                self.check();
                limit = self.limit_vmas();
            }
        }
        if used > limit {
            self.release(vmas, exact);
            return false;
        }
        true
    }

    /// Releases what [`ProcessBudget::charge`] charged (never below 0).
    pub(crate) fn release(&self, vmas: u64, exact: bool) {
        let _ = self
            .counter(exact)
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(vmas))
            });
    }

    /// Counts the lines of `/proc/self/maps` (through the kept fd of a
    /// [`MapsSource::Fd`]) and checks the accounting against them:
    /// refreshes the foreign count and logs a warning on drift. `None` when
    /// the file cannot be read (no `/proc` in a sandbox, no free file
    /// descriptor) or another thread is measuring.
    pub fn check(&self) -> Option<BudgetCheck> {
        let process_vmas = {
            let Ok(mut buf) = self.buf.try_lock() else {
                return None;
            };
            match count_maps_lines(self.maps.fd(), &mut buf) {
                Ok(lines) => {
                    self.maps_unreadable.store(false, Ordering::Relaxed);
                    lines
                }
                Err(e) => {
                    if !self.maps_unreadable.swap(true, Ordering::Relaxed) {
                        log::warn!(
                            "coro-pool: cannot read /proc/self/maps ({e}); the mapping budget \
                             counts only the coroutine stacks until it can"
                        );
                    }
                    return None;
                }
            }
        };
        let exact = self.exact_vmas.load(Ordering::Relaxed);
        let pool_vmas = self.pool_vmas();
        let foreign = process_vmas.saturating_sub(pool_vmas);
        self.foreign.store(foreign, Ordering::Relaxed);
        self.measured.store(process_vmas, Ordering::Relaxed);
        self.measured_at.store(pool_vmas, Ordering::Relaxed);
        self.measurements.fetch_add(1, Ordering::Relaxed);
        let drifted = process_vmas < exact;
        if drifted {
            self.drift_warnings.fetch_add(1, Ordering::Relaxed);
            log::warn!(
                "coro-pool: VMA accounting drift: the pools account for {exact} VMAs of \
                 mprotect-guarded stacks, but /proc/self/maps lists only {process_vmas} VMAs"
            );
        }
        if self.measure_foreign {
            let over = foreign > self.reserved_vmas() / 2;
            if over != self.over_reserve.swap(over, Ordering::Relaxed) {
                if over {
                    log::warn!(
                        "coro-pool: {foreign} mappings besides the coroutine stacks, more than \
                         half the reserve of {} VMAs; the stacks' budget shrinks to {} VMAs",
                        self.reserved_vmas(),
                        self.limit_vmas()
                    );
                } else {
                    log::info!(
                        "coro-pool: other mappings back to {foreign}, within the reserve; \
                         the stacks' budget is {} VMAs again",
                        self.limit_vmas()
                    );
                }
            }
        }
        Some(BudgetCheck {
            process_vmas,
            pool_vmas,
            exact_pool_vmas: exact,
            foreign_vmas: foreign,
            drifted,
        })
    }

    /// A snapshot of the budget's counters.
    pub fn stats(&self) -> BudgetStats {
        let resolved = self.mmc.get().is_some();
        BudgetStats {
            max_map_count: if resolved { self.max_map_count().0 } else { 0 },
            reserved_vmas: if resolved { self.reserved_vmas() } else { 0 },
            limit_vmas: if resolved { self.limit_vmas() } else { 0 },
            pool_vmas: self.pool_vmas(),
            foreign_vmas: self.foreign.load(Ordering::Relaxed),
            measured_process_vmas: self.measured.load(Ordering::Relaxed),
            measurements: self.measurements.load(Ordering::Relaxed),
            drift_warnings: self.drift_warnings.load(Ordering::Relaxed),
        }
    }
}

/// Lines of `/proc/self/maps`, read through `buf` with raw `pread` (no
/// allocation): from `kept` if given, else from a fresh `open`.
fn count_maps_lines(kept: Option<RawFd>, buf: &mut [u8]) -> io::Result<u64> {
    const PATH: &[u8] = b"/proc/self/maps\0";
    let fd = match kept {
        Some(fd) => fd,
        // SAFETY: PATH is NUL-terminated; open has no other preconditions.
        None => unsafe { libc::open(PATH.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) },
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut lines = 0u64;
    let mut offset: libc::off_t = 0;
    let result = loop {
        // SAFETY: reads at most buf.len() bytes into buf, which we own.
        let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), offset) };
        if n == 0 {
            break Ok(lines);
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break Err(e);
        }
        offset += n as libc::off_t;
        lines += buf[..n as usize].iter().filter(|b| **b == b'\n').count() as u64;
    };
    if kept.is_none() {
        // SAFETY: fd was opened above and is closed once.
        unsafe { libc::close(fd) };
    }
    result
}
