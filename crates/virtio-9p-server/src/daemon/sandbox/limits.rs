// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `RLIMIT_NOFILE`, and the fd budgets that keep the fd count below it:
//! half for the `O_PATH` fds of walked files (a cache: past it, idle ones
//! are closed and reopened on use), half for open files, divided between
//! the sessions.

use super::{sys_err, Error, Result};

/// fds the daemon needs besides fids: stdio, sockets, eventfds, epoll,
/// timerfd, /proc, the export root, per-connection vring kicks and calls,
/// and fds opened briefly while serving (reopened files, directories).
/// The pipes of spliced Rreads in socket mode come from it too: at most
/// 16 pipes (32 fds) and 16 duplicated file fds per socket thread, at
/// most 4 socket threads, so 192 fds at the worst; when no fd is left a
/// read is copied instead of spliced, so a short reserve slows reads and
/// fails none.
pub const FD_RESERVE: u64 = 256;

/// Socket clients the open-file budget is shared by: each of them may
/// hold `open_fid_budget(nofile, BUDGETED_CLIENTS, ..)` open fids. More
/// clients still connect (up to the transport's limit); once the fds run
/// out, opens fail with `EMFILE` and the daemon keeps serving.
pub const BUDGETED_CLIENTS: usize = 16;

/// The smallest open-fid budget the daemon runs with.
pub const MIN_FIDS: usize = 64;

/// Sets `RLIMIT_NOFILE` to `want` (soft and hard), or, with `None`, raises
/// the soft limit to the hard one; `Some(0)` leaves the limit alone (as
/// virtiofsd's `--rlimit-nofile 0`). Returns the soft limit in force.
pub fn set_nofile(want: Option<u64>) -> Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(sys_err("getrlimit(RLIMIT_NOFILE)"));
    }
    let new = match want {
        Some(0) => return Ok(lim.rlim_cur),
        Some(n) => libc::rlimit {
            rlim_cur: n,
            rlim_max: n,
        },
        None => libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        },
    };
    // SAFETY: `new` is a valid rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } != 0 {
        return Err(Error::SetNofile {
            want: new.rlim_cur,
            hard: lim.rlim_max,
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(new.rlim_cur)
}

/// The open fids one session may hold so that `sessions` sessions with
/// every one of them open, and a full cache of walked files' fds
/// ([`path_fd_budget`]), stay below `nofile`: `(nofile - FD_RESERVE) / 2
/// / sessions`, capped at `max_fids` (the caller refuses a budget below
/// [`MIN_FIDS`]).
pub fn open_fid_budget(nofile: u64, sessions: usize, max_fids: usize) -> usize {
    let per = path_fd_budget(nofile) as u64 / (sessions.max(1) as u64);
    per.min(max_fids as u64) as usize
}

/// The `O_PATH` fds walked files may keep open, for all sessions
/// together: `(nofile - FD_RESERVE) / 2`.
pub fn path_fd_budget(nofile: u64) -> usize {
    usize::try_from(nofile.saturating_sub(FD_RESERVE) / 2).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_zero_leaves_the_limit_alone() {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `lim` is a valid out pointer.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(set_nofile(Some(0)).unwrap(), lim.rlim_cur);
        let mut after = lim;
        // SAFETY: `after` is a valid out pointer.
        let r = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut after) };
        assert_eq!(r, 0);
        assert_eq!(
            (after.rlim_cur, after.rlim_max),
            (lim.rlim_cur, lim.rlim_max)
        );
    }

    #[test]
    fn test_fd_budgets() {
        assert_eq!(open_fid_budget(1 << 20, 1, 65536), 65536);
        assert_eq!(open_fid_budget(4096, 1, 65536), (4096 - 256) / 2);
        assert_eq!(open_fid_budget(4096, 8, 65536), (4096 - 256) / 2 / 8);
        assert_eq!(open_fid_budget(100, 1, 65536), 0);
        assert_eq!(path_fd_budget(4096), (4096 - 256) / 2);
        assert_eq!(path_fd_budget(100), 0);
    }
}
