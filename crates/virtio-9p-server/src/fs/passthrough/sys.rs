// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Thin, checked wrappers over the Linux calls the passthrough uses.

use std::ffi::{CStr, CString};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU8, Ordering};

/// Turns a `-1` return into the thread's errno, retrying on EINTR.
macro_rules! check {
    ($e:expr) => {{
        loop {
            let ret = $e;
            if ret != -1 {
                break Ok(ret);
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                break Err(err);
            }
        }
    }};
}
pub(crate) use check;

/// A name as a C string (names are validated NUL-free before they get
/// here; a NUL still fails cleanly).
pub fn cstr(name: &[u8]) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Takes ownership of a freshly returned fd.
fn own(fd: libc::c_int) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful open-like call and is
    // owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// `openat` of a plain path (no dirfd confinement); used for the export
/// root and `/proc/self/fd` at startup only.
pub fn open_path(path: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: `path` is a valid C string; the returned fd is checked.
    let fd = check!(unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) })?;
    Ok(own(fd))
}

const OPENAT2_UNKNOWN: u8 = 0;
const OPENAT2_YES: u8 = 1;
const OPENAT2_NO: u8 = 2;
static OPENAT2: AtomicU8 = AtomicU8::new(OPENAT2_UNKNOWN);

/// Whether the running kernel has `openat2` (probed once).
pub fn have_openat2() -> bool {
    match OPENAT2.load(Ordering::Relaxed) {
        OPENAT2_YES => true,
        OPENAT2_NO => false,
        _ => {
            let dot = c".";
            let res = openat2(libc::AT_FDCWD, dot, libc::O_PATH, libc::RESOLVE_BENEATH);
            let yes = !matches!(&res, Err(e) if e.raw_os_error() == Some(libc::ENOSYS));
            OPENAT2.store(
                if yes { OPENAT2_YES } else { OPENAT2_NO },
                Ordering::Relaxed,
            );
            yes
        }
    }
}

fn openat2(dir: RawFd, name: &CStr, flags: libc::c_int, resolve: u64) -> io::Result<OwnedFd> {
    // SAFETY: `open_how` is plain old data; zeroed is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
        0o600
    } else {
        0
    };
    how.resolve = resolve;
    // SAFETY: `how` and `name` are valid for the call; the size matches
    // the struct passed.
    let fd = check!(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir,
            name.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    })?;
    Ok(own(fd as libc::c_int))
}

/// Opens one name under `dir` without following any symlink and without
/// leaving `dir`: `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS |
/// RESOLVE_NO_SYMLINKS)` when the kernel has it and `use_openat2` is set,
/// else `openat(O_NOFOLLOW)` of the single, already validated component.
/// `mode` applies with `O_CREAT`.
pub fn open_beneath(
    dir: BorrowedFd<'_>,
    name: &CStr,
    flags: libc::c_int,
    mode: u32,
    use_openat2: bool,
) -> io::Result<OwnedFd> {
    let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    if use_openat2 && have_openat2() {
        // SAFETY: `open_how` is plain old data; zeroed is a valid value.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = flags as u64;
        how.mode = if flags & libc::O_CREAT != 0 {
            mode as u64
        } else {
            0
        };
        how.resolve =
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS | libc::RESOLVE_NO_SYMLINKS;
        // SAFETY: `how` and `name` are valid for the call and the size
        // matches the struct.
        let fd = check!(unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                name.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        })?;
        return Ok(own(fd as libc::c_int));
    }
    // SAFETY: valid dirfd and C string; the mode is passed as the variadic
    // argument openat expects.
    let fd = check!(unsafe {
        libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, mode as libc::c_uint)
    })?;
    Ok(own(fd))
}

/// `openat(dir, "..")` as an `O_PATH` directory fd.
pub fn open_parent(dir: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: valid dirfd and C string.
    let fd = check!(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c"..".as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    })?;
    Ok(own(fd))
}

/// Reopens an `O_PATH` fd for I/O through `/proc/self/fd`.
pub fn reopen(
    proc_fd: BorrowedFd<'_>,
    fd: BorrowedFd<'_>,
    flags: libc::c_int,
) -> io::Result<OwnedFd> {
    let name = cstr(fd.as_raw_fd().to_string().as_bytes())?;
    let flags = (flags & !libc::O_NOFOLLOW) | libc::O_CLOEXEC | libc::O_NOCTTY;
    // SAFETY: valid dirfd and C string.
    let fd = check!(unsafe { libc::openat(proc_fd.as_raw_fd(), name.as_ptr(), flags) })?;
    Ok(own(fd))
}

/// Reopens a directory fd (`O_PATH` or `O_DIRECTORY`) as a new `O_PATH`
/// fd of the same directory: `ENOTDIR` for anything else, `EBADF` for a
/// closed fd.
pub fn reopen_dir(dir: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: a dirfd (possibly invalid: the kernel checks it) and a valid
    // C string.
    let fd = check!(unsafe { libc::openat(dir.as_raw_fd(), c".".as_ptr(), flags) })?;
    Ok(own(fd))
}

/// Checks that `proc_fd` is this process's `/proc/self/fd`: a procfs
/// directory whose entry for `probe` (an fd of ours) leads to the file
/// `st` describes. An `InvalidInput` error saying which check failed
/// otherwise.
pub fn check_proc_self_fd(
    proc_fd: BorrowedFd<'_>,
    probe: BorrowedFd<'_>,
    st: &libc::stat64,
) -> io::Result<()> {
    let mut fs = MaybeUninit::<libc::statfs64>::uninit();
    // SAFETY: a valid fd and out pointer for one statfs64.
    check!(unsafe { libc::fstatfs64(proc_fd.as_raw_fd(), fs.as_mut_ptr()) })?;
    // SAFETY: fstatfs64 succeeded, so it filled `fs`.
    let fs = unsafe { fs.assume_init() };
    let not_ours = |what| io::Error::new(io::ErrorKind::InvalidInput, what);
    if fs.f_type != libc::PROC_SUPER_MAGIC {
        return Err(not_ours("not a procfs directory"));
    }
    let name = cstr(probe.as_raw_fd().to_string().as_bytes())?;
    let mut got = MaybeUninit::<libc::stat64>::uninit();
    let res = check!(
        // SAFETY: valid dirfd, C string and out pointer; following the
        // entry (a magic link) is the point.
        unsafe { libc::fstatat64(proc_fd.as_raw_fd(), name.as_ptr(), got.as_mut_ptr(), 0) }
    );
    match res {
        Ok(_) => {
            // SAFETY: fstatat64 succeeded, so it filled `got`.
            let got = unsafe { got.assume_init() };
            if (got.st_dev, got.st_ino) == (st.st_dev, st.st_ino) {
                Ok(())
            } else {
                Err(not_ours("its entries are not this process's fds"))
            }
        }
        // Not an fd directory, or another process's.
        Err(_) => Err(not_ours("it does not list this process's fds")),
    }
}

/// Where the path-only calls (xattrs, the `/proc` fallback of link) find
/// the file an `O_PATH` fd names: `fgetxattr` and friends refuse `O_PATH`
/// fds, so they go through the fd's `/proc/self/fd/N` entry.
#[derive(Debug)]
pub struct FdPath {
    /// `/proc/self/fd/N`, or `N` when the current directory is
    /// `/proc/self/fd`.
    path: CString,
    /// `N` relative to a `/proc/self/fd` directory fd, for the `*xattrat`
    /// calls (Linux 6.13): no `/proc` mount needed.
    at: Option<(RawFd, CString)>,
}

impl FdPath {
    /// The path string.
    pub fn path(&self) -> &CStr {
        &self.path
    }

    /// `N` relative to the `/proc/self/fd` directory fd, if there is one.
    pub fn at(&self) -> Option<(RawFd, &CStr)> {
        self.at.as_ref().map(|(d, n)| (*d, n.as_c_str()))
    }

    /// Runs `at` on the `*xattrat` form when there is one and the kernel
    /// has the calls, else `path` on the path string. Both return the
    /// raw syscall result (`-1` with errno on failure).
    fn call(
        &self,
        mut at: impl FnMut(RawFd, &CStr) -> isize,
        mut path: impl FnMut(&CStr) -> isize,
    ) -> isize {
        if let Some((dir, name)) = self.at() {
            if XATTRAT.load(Ordering::Relaxed) != OPENAT2_NO {
                let ret = at(dir, name);
                if ret != -1 || io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS) {
                    return ret;
                }
                XATTRAT.store(OPENAT2_NO, Ordering::Relaxed);
            }
        }
        path(&self.path)
    }
}

/// The `/proc/self/fd/N` path of an fd; with `relative`, just `N` (the
/// current directory is `/proc/self/fd`); with `proc_fd`, also `N`
/// relative to that `/proc/self/fd` directory fd.
pub fn proc_path(fd: BorrowedFd<'_>, relative: bool, proc_fd: Option<BorrowedFd<'_>>) -> FdPath {
    // A formatted integer never contains NUL. Inside the namespace sandbox
    // /proc is not under `/`: the current directory is /proc/self/fd there.
    let n = fd.as_raw_fd().to_string();
    let path = if relative {
        n.clone()
    } else {
        format!("/proc/self/fd/{n}")
    };
    FdPath {
        path: CString::new(path).unwrap_or_default(),
        at: proc_fd.map(|p| (p.as_raw_fd(), CString::new(n).unwrap_or_default())),
    }
}

/// Whether the kernel has the `*xattrat` calls (probed on first use; the
/// values of [`OPENAT2`]).
static XATTRAT: AtomicU8 = AtomicU8::new(OPENAT2_UNKNOWN);

/// Linux 6.13 `*xattrat` syscall numbers (the same on every architecture:
/// the unified table; the libc crate does not name them yet).
pub const SYS_SETXATTRAT: libc::c_long = 463;
/// See [`SYS_SETXATTRAT`].
pub const SYS_GETXATTRAT: libc::c_long = 464;
/// See [`SYS_SETXATTRAT`].
pub const SYS_LISTXATTRAT: libc::c_long = 465;
/// See [`SYS_SETXATTRAT`].
pub const SYS_REMOVEXATTRAT: libc::c_long = 466;

/// The kernel's `struct xattr_args`.
#[repr(C)]
struct XattrArgs {
    value: u64,
    size: u32,
    flags: u32,
}

/// `fstat` (works on `O_PATH` fds).
pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat64> {
    fstat_raw(fd.as_raw_fd())
}

/// `fstat` of a raw fd that may have been closed meanwhile (then `EBADF`,
/// or the metadata of whatever file reuses the number: the caller checks).
/// It only reads metadata, so a stale fd has no effect on any file.
///
/// On 64-bit targets it is the `fstat` system call itself: glibc's
/// `fstat64` makes `newfstatat(fd, "", AT_EMPTY_PATH)`, whose empty-path
/// handling costs about 20 ns more per call (160 against 140 ns on the
/// benchmark machine, 2026-12-06), nearly a tenth of an in-process
/// Tgetattr. The kernel's `struct stat` is glibc's `stat64` on those
/// targets.
pub fn fstat_raw(fd: RawFd) -> io::Result<libc::stat64> {
    let mut st = MaybeUninit::<libc::stat64>::uninit();
    check!({
        #[cfg(target_pointer_width = "64")]
        // SAFETY: `st` is a valid out pointer for one `struct stat`, which
        // is `stat64` on 64-bit Linux; any fd number is acceptable to the
        // kernel.
        let ret = unsafe { libc::syscall(libc::SYS_fstat, fd, st.as_mut_ptr()) };
        #[cfg(not(target_pointer_width = "64"))]
        // SAFETY: `st` is a valid out pointer for one stat64; any fd number
        // is acceptable to the kernel.
        let ret = unsafe { libc::fstat64(fd, st.as_mut_ptr()) };
        ret
    })?;
    // SAFETY: the call succeeded, so it filled `st`.
    Ok(unsafe { st.assume_init() })
}

/// The filesystem type (`f_type` of `fstatfs`, a `*_MAGIC` number) of the
/// filesystem `fd` is on (works on `O_PATH` fds).
pub fn fs_type(fd: BorrowedFd<'_>) -> io::Result<i64> {
    let mut fs = MaybeUninit::<libc::statfs64>::uninit();
    // SAFETY: a valid fd and out pointer for one statfs64.
    check!(unsafe { libc::fstatfs64(fd.as_raw_fd(), fs.as_mut_ptr()) })?;
    // SAFETY: fstatfs64 succeeded, so it filled `fs`.
    let fs = unsafe { fs.assume_init() };
    // `f_type` is a `c_long` on most targets, a `c_uint` on s390x.
    #[allow(clippy::unnecessary_cast)]
    Ok(fs.f_type as i64)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
pub fn fstatat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<libc::stat64> {
    let mut st = MaybeUninit::<libc::stat64>::uninit();
    // SAFETY: valid dirfd, C string and out pointer.
    check!(unsafe {
        libc::fstatat64(
            dir.as_raw_fd(),
            name.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    // SAFETY: fstatat64 succeeded, so it filled `st`.
    Ok(unsafe { st.assume_init() })
}

/// `statx(fd, "", AT_EMPTY_PATH)` with the basic fields and btime, on a
/// raw fd that may have been closed meanwhile, as [`fstat_raw`].
pub fn statx_raw(fd: RawFd) -> io::Result<libc::statx> {
    let mut st = MaybeUninit::<libc::statx>::uninit();
    // SAFETY: any fd number, empty C string with AT_EMPTY_PATH, valid out
    // pointer.
    check!(unsafe {
        libc::statx(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_SYNC_AS_STAT,
            libc::STATX_BASIC_STATS | libc::STATX_BTIME,
            st.as_mut_ptr(),
        )
    })?;
    // SAFETY: statx succeeded, so it filled `st`.
    Ok(unsafe { st.assume_init() })
}

/// `getxattrat`/`setxattrat(dir, path, 0, name, &args, sizeof args)`
/// with `args` describing `value` (`len` bytes) and `flags`.
///
/// # Safety
///
/// `value` is valid for `len` bytes (written by `getxattrat`, read by
/// `setxattrat`), or null with `len` 0.
unsafe fn xattrat(
    nr: libc::c_long,
    dir: RawFd,
    path: &CStr,
    name: &CStr,
    value: *mut u8,
    len: usize,
    flags: u32,
) -> isize {
    let mut args = XattrArgs {
        value: value as u64,
        size: len as u32,
        flags,
    };
    // SAFETY: valid C strings; `args` describes a buffer the caller vouches
    // for, and its own size is passed.
    unsafe {
        libc::syscall(
            nr,
            dir,
            path.as_ptr(),
            0,
            name.as_ptr(),
            &mut args as *mut XattrArgs,
            std::mem::size_of::<XattrArgs>(),
        ) as isize
    }
}

/// `getxattr` of a file into a buffer of at most `max` bytes (`E2BIG` if
/// larger).
pub fn getxattr(path: &FdPath, name: &CStr, max: usize) -> io::Result<Vec<u8>> {
    xattr_read(max, |buf, len| {
        path.call(
            // SAFETY: `buf` is valid for `len` bytes (or null with len 0 to
            // query the size).
            |dir, n| unsafe { xattrat(SYS_GETXATTRAT, dir, n, name, buf, len, 0) },
            // SAFETY: valid C strings; `buf` is valid for `len` bytes (or
            // null with len 0 to query the size).
            |p| unsafe { libc::getxattr(p.as_ptr(), name.as_ptr(), buf.cast(), len) },
        )
    })
}

/// `listxattr` of a file, at most `max` bytes.
pub fn listxattr(path: &FdPath, max: usize) -> io::Result<Vec<u8>> {
    xattr_read(max, |buf, len| {
        path.call(
            // SAFETY: valid dirfd and C string; `buf` valid for `len` bytes
            // or null/0.
            |dir, n| unsafe {
                libc::syscall(SYS_LISTXATTRAT, dir, n.as_ptr(), 0, buf, len) as isize
            },
            // SAFETY: valid C string; `buf` valid for `len` bytes or null/0.
            |p| unsafe { libc::listxattr(p.as_ptr(), buf.cast(), len) },
        )
    })
}

fn xattr_read(max: usize, mut call: impl FnMut(*mut u8, usize) -> isize) -> io::Result<Vec<u8>> {
    for _ in 0..4 {
        let size = check!(call(std::ptr::null_mut(), 0))? as usize;
        if size > max {
            return Err(io::Error::from_raw_os_error(libc::E2BIG));
        }
        let mut buf = vec![0u8; size];
        match check!(call(buf.as_mut_ptr(), buf.len())) {
            Ok(n) => {
                buf.truncate(n as usize);
                return Ok(buf);
            }
            // The value grew between the two calls: ask again.
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::from_raw_os_error(libc::ERANGE))
}

/// `setxattr` of a file.
pub fn setxattr(path: &FdPath, name: &CStr, value: &[u8], flags: u32) -> io::Result<()> {
    check!(path.call(
        // SAFETY: `value` is valid for its length; the kernel only reads it.
        |dir, n| unsafe {
            let value_ptr = value.as_ptr().cast_mut();
            xattrat(SYS_SETXATTRAT, dir, n, name, value_ptr, value.len(), flags)
        },
        // SAFETY: valid C strings and value buffer.
        |p| unsafe {
            libc::setxattr(
                p.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags as libc::c_int,
            ) as isize
        },
    ))?;
    Ok(())
}

/// `removexattr` of a file.
pub fn removexattr(path: &FdPath, name: &CStr) -> io::Result<()> {
    check!(path.call(
        // SAFETY: valid dirfd and C strings.
        |dir, n| unsafe {
            libc::syscall(SYS_REMOVEXATTRAT, dir, n.as_ptr(), 0, name.as_ptr()) as isize
        },
        // SAFETY: valid C strings.
        |p| unsafe { libc::removexattr(p.as_ptr(), name.as_ptr()) as isize },
    ))?;
    Ok(())
}

/// `readlinkat(fd, "")` of an `O_PATH` symlink fd.
pub fn readlink(fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: valid fd, empty C string, buffer valid for its length.
    let n = check!(unsafe {
        libc::readlinkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })? as usize;
    buf.truncate(n);
    Ok(buf)
}

/// `getdents64` into `buf`; returns the bytes filled (0 at the end).
pub fn getdents64(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: valid fd and a buffer valid for its length.
    let n = check!(unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            fd.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    })?;
    Ok(n as usize)
}

/// `lseek(fd, off, SEEK_SET)`.
pub fn seek(fd: BorrowedFd<'_>, off: u64) -> io::Result<()> {
    // SAFETY: plain syscall on a valid fd.
    check!(unsafe { libc::lseek64(fd.as_raw_fd(), off as libc::off64_t, libc::SEEK_SET) })?;
    Ok(())
}
