// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Part of suite `virtio-9p`: zero-copy Rread. Is splicing Rread data
//! into the socket faster than the copy, alone (file to socket, no 9P)
//! and end to end (the same socket server with `splice_reads` on and
//! off)?

use std::error::Error;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Instant;

use super::peers::OursSocket;
use super::socket_client::Session;
use crate::harness::{alternate, format_value, Ctx, SuiteReport, Table};

type Res<T> = Result<T, Box<dyn Error>>;

const GIB: f64 = (1u64 << 30) as f64;
const KIB: u32 = 1024;

/// Sends `total` bytes of `file` (cached) into a unix socket whose peer
/// drains it, `chunk` bytes per Rread-sized step: by `pread` into one
/// buffer and `send` (what the socket transport does), or by `splice`
/// through a pipe (file to pipe, pipe to socket: no user-space copy).
/// GiB/s.
pub(super) fn rread_to_socket(file: &File, total: u64, chunk: usize, splice: bool) -> Res<f64> {
    use std::os::fd::AsRawFd;
    let (tx, mut rx) = UnixStream::pair()?;
    let drain = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        while let Ok(n) = rx.read(&mut buf) {
            if n == 0 {
                break;
            }
            got += n as u64;
        }
        got
    });
    let len = file.metadata()?.len();
    let fd = file.as_raw_fd();
    let mut pipe = [0i32; 2];
    if splice {
        // SAFETY: pipe2 writes two fds into the array.
        if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        // SAFETY: F_SETPIPE_SZ on the pipe just made.
        unsafe { libc::fcntl(pipe[1], libc::F_SETPIPE_SZ, chunk.max(1 << 16) as i32) };
    }
    let mut buf = vec![0u8; chunk];
    let start = Instant::now();
    let (mut done, mut off) = (0u64, 0u64);
    while done < total {
        if off + chunk as u64 > len {
            off = 0;
        }
        if splice {
            let mut left = chunk;
            let mut o = off as libc::loff_t;
            while left > 0 {
                // SAFETY: splice between fds we hold; `o` is valid for the call.
                let n = unsafe {
                    libc::splice(
                        fd,
                        &mut o,
                        pipe[1],
                        std::ptr::null_mut(),
                        left,
                        libc::SPLICE_F_MOVE,
                    )
                };
                if n <= 0 {
                    return Err(std::io::Error::last_os_error().into());
                }
                let mut out = n as usize;
                while out > 0 {
                    // SAFETY: as above, no offsets.
                    let m = unsafe {
                        libc::splice(
                            pipe[0],
                            std::ptr::null_mut(),
                            tx.as_raw_fd(),
                            std::ptr::null_mut(),
                            out,
                            libc::SPLICE_F_MOVE,
                        )
                    };
                    if m <= 0 {
                        return Err(std::io::Error::last_os_error().into());
                    }
                    out -= m as usize;
                }
                left -= n as usize;
            }
        } else {
            std::os::unix::fs::FileExt::read_exact_at(file, &mut buf, off)?;
            (&tx).write_all(&buf)?;
        }
        done += chunk as u64;
        off += chunk as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    if splice {
        // SAFETY: closing the pipe fds made above.
        unsafe {
            libc::close(pipe[0]);
            libc::close(pipe[1]);
        }
    }
    drop(tx);
    let _ = drain.join();
    Ok(done as f64 / GIB / secs)
}

/// Zero-copy Rread end to end: the same socket server with
/// Rread data spliced (the default) and copied through the reply buffer
/// (`SocketLimits::splice_reads` false), sequential reads at msize 64 KiB
/// with 1, 4 and 16 outstanding, in alternation.
pub(super) fn splice_e2e_part(
    ctx: &Ctx,
    report: &mut SuiteReport,
    table: &mut Table,
    spliced: &mut OursSocket,
    copied: &mut OursSocket,
    aname: &[u8],
    file_len: u64,
) -> Res<()> {
    let msize = 64 * KIB;
    let total: u64 = ctx.pick(512 << 20, 16 << 20);
    for depth in [1u16, 4, 16] {
        let mut a = Session::open(spliced.connect()?, msize, aname, file_len)?;
        let mut b = Session::open(copied.connect()?, msize, aname, file_len)?;
        a.read_depth(depth, total / 8)?;
        b.read_depth(depth, total / 8)?;
        let [s, c] = alternate(
            ctx.reps(),
            &mut [&mut || a.read_depth(depth, total), &mut || {
                b.read_depth(depth, total)
            }],
        )?;
        report
            .metric(&format!("sock_read_gib_per_s_depth{depth}_copy"), c)
            .metric(&format!("sock_splice_vs_copy_depth{depth}"), s / c);
        table.row(&[
            format!("sequential read, {depth} outstanding: spliced / copied Rread (GiB/s)"),
            format!("{} / {}", format_value(s), format_value(c)),
            "-".into(),
            format!("x{}", format_value(s / c)),
        ]);
    }
    Ok(())
}

pub(super) fn splice_part(ctx: &Ctx, report: &mut SuiteReport, export: &Path) -> Res<()> {
    let file = File::open(export.join("big"))?;
    let total: u64 = ctx.pick(1 << 30, 32 << 20);
    let chunk = 64 << 10;
    rread_to_socket(&file, total / 8, chunk, false)?;
    rread_to_socket(&file, total / 8, chunk, true)?;
    let [copy, splice] = alternate(
        ctx.reps(),
        &mut [
            &mut || rread_to_socket(&file, total, chunk, false),
            &mut || rread_to_socket(&file, total, chunk, true),
        ],
    )?;
    report
        .metric("rread_copy_gib_per_s", copy)
        .metric("rread_splice_gib_per_s", splice)
        .metric("rread_splice_vs_copy", splice / copy);
    report.note(format!(
        "Rread by splice: 64 KiB of a cached file into a unix socket whose peer drains it, \
         {} MiB per run: pread into one buffer and send (the socket transport's path) \
         {copy:.2} GiB/s, splice file -> pipe -> socket {splice:.2} GiB/s ({:.2}x).",
        total >> 20,
        splice / copy
    ));
    Ok(())
}
