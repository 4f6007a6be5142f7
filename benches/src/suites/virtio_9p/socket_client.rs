// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The load generator of the socket parts: a plain 9P client on a unix
//! socket (the `test-utils` client of `virtio-9p-server` for the session
//! set-up, and a lean Tread/Tgetattr loop over the same stream that
//! reuses one reply buffer), and a trivial server that measures the
//! client's own ceiling.

use std::error::Error;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use virtio_9p_server::client::{Client, StreamTransport};
use virtio_9p_server::protocol::{
    GetattrMask, LockFlags, LockType, MsgType, OpenFlags, Rmessage, Tattach, Tfid, Tgetattr, Tlock,
    Tmessage, Tread, Twalk, IOHDRSZ, NOFID,
};

type Res<T> = Result<T, Box<dyn Error>>;

pub(super) const GIB: f64 = (1u64 << 30) as f64;
pub(super) const KIB: u32 = 1024;

pub(super) const ROOT: u32 = 0;
pub(super) const BIG: u32 = 1;
pub(super) const SMALL: u32 = 2;
pub(super) const WALKED: u32 = 3;

/// One negotiated session of the load generator.
pub(super) struct Session {
    pub(super) client: Client<StreamTransport<UnixStream>>,
    pub(super) msize: u32,
    pub(super) reply: Vec<u8>,
    pub(super) offset: u64,
    pub(super) file_len: u64,
}

impl Session {
    /// Tversion, Tattach as root to `aname`, walks to "big" (opened for
    /// reading) and "f".
    pub(super) fn open(stream: UnixStream, msize: u32, aname: &[u8], file_len: u64) -> Res<Self> {
        let mut client = Client::new(StreamTransport(stream));
        let granted = client.version(msize)?;
        match client.rpc(&Tmessage::Attach(Tattach {
            fid: ROOT,
            afid: NOFID,
            uname: b"root".to_vec(),
            aname: aname.to_vec(),
            n_uname: 0,
        }))? {
            Rmessage::Attach(_) => {}
            r => return Err(format!("attach: unexpected reply {r:?}").into()),
        }
        client.walk(ROOT, BIG, &[b"big"])?;
        client.lopen(BIG, OpenFlags::RDONLY)?;
        client.walk(ROOT, SMALL, &[b"f"])?;
        Ok(Session {
            client,
            msize: granted,
            reply: vec![0u8; granted as usize],
            offset: 0,
            file_len,
        })
    }

    /// Sends `frame` and reads the reply into the reused buffer; returns
    /// the reply's type and its length.
    pub(super) fn call(&mut self, frame: &[u8]) -> Res<(u8, usize)> {
        let stream = &mut self.client.transport().0;
        stream.write_all(frame)?;
        stream.read_exact(&mut self.reply[..4])?;
        let size = u32::from_le_bytes(self.reply[..4].try_into()?) as usize;
        if size < 7 || size > self.reply.len() {
            return Err(format!("reply of {size} bytes at msize {}", self.msize).into());
        }
        stream.read_exact(&mut self.reply[4..size])?;
        let ty = self.reply[4];
        if ty == MsgType::Rlerror {
            let errno = u32::from_le_bytes(self.reply[7..11].try_into()?);
            return Err(format!("Rlerror {errno}").into());
        }
        Ok((ty, size))
    }

    /// Sequential Treads of `msize - IOHDRSZ` bytes until `total` bytes
    /// came back; GiB/s.
    pub(super) fn read(&mut self, total: u64) -> Res<f64> {
        let count = self.msize - IOHDRSZ;
        let mut done = 0u64;
        let start = Instant::now();
        while done < total {
            let frame = self.next_read(1);
            let (ty, size) = self.call(&frame)?;
            let got = u32::from_le_bytes(self.reply[7..11].try_into()?);
            if ty != MsgType::Rread || got != count || size != 11 + count as usize {
                return Err(format!("Tread of {count}: reply type {ty}, {got} bytes").into());
            }
            done += u64::from(got);
        }
        Ok(done as f64 / GIB / start.elapsed().as_secs_f64())
    }

    /// µs per Tgetattr (basic attributes) of a small file.
    pub(super) fn getattr_us(&mut self, iters: usize) -> Res<f64> {
        let frame = Tmessage::Getattr(Tgetattr {
            fid: SMALL,
            request_mask: GetattrMask::BASIC,
        })
        .encode_frame(2);
        let start = Instant::now();
        for _ in 0..iters {
            let (ty, _) = self.call(&frame)?;
            if ty != MsgType::Rgetattr {
                return Err(format!("Tgetattr: reply type {ty}").into());
            }
        }
        Ok(start.elapsed().as_secs_f64() * 1e6 / iters as f64)
    }

    /// Sends one frame.
    pub(super) fn send(&mut self, frame: &[u8]) -> Res<()> {
        self.client.transport().0.write_all(frame)?;
        Ok(())
    }

    /// Reads one reply into the reused buffer: (tag, type, size).
    pub(super) fn recv(&mut self) -> Res<(u16, u8, usize)> {
        let stream = &mut self.client.transport().0;
        stream.read_exact(&mut self.reply[..4])?;
        let size = u32::from_le_bytes(self.reply[..4].try_into()?) as usize;
        if size < 7 || size > self.reply.len() {
            return Err(format!("reply of {size} bytes at msize {}", self.msize).into());
        }
        stream.read_exact(&mut self.reply[4..size])?;
        let tag = u16::from_le_bytes(self.reply[5..7].try_into()?);
        Ok((tag, self.reply[4], size))
    }

    /// The next sequential Tread of `msize - IOHDRSZ` bytes, as a frame
    /// with `tag`.
    pub(super) fn next_read(&mut self, tag: u16) -> Vec<u8> {
        let count = self.msize - IOHDRSZ;
        if self.offset + u64::from(count) > self.file_len {
            self.offset = 0;
        }
        let frame = Tmessage::Read(Tread {
            fid: BIG,
            offset: self.offset,
            count,
        })
        .encode_frame(tag);
        self.offset += u64::from(count);
        frame
    }

    /// Sequential Treads with `depth` outstanding on this connection until
    /// `total` bytes came back; GiB/s.
    pub(super) fn read_depth(&mut self, depth: u16, total: u64) -> Res<f64> {
        let count = u64::from(self.msize - IOHDRSZ);
        let n = total.div_ceil(count);
        let start = Instant::now();
        let mut sent = 0u64;
        for tag in 1..=depth {
            if sent < n {
                let f = self.next_read(tag);
                self.send(&f)?;
                sent += 1;
            }
        }
        let mut done = 0u64;
        for _ in 0..n {
            let (tag, ty, size) = self.recv()?;
            let got = u32::from_le_bytes(self.reply[7..11].try_into()?);
            if ty != MsgType::Rread || u64::from(got) != count || size != 11 + count as usize {
                return Err(format!("Tread of {count}: reply type {ty}, {got} bytes").into());
            }
            done += u64::from(got);
            if sent < n {
                let f = self.next_read(tag);
                self.send(&f)?;
                sent += 1;
            }
        }
        Ok(done as f64 / GIB / start.elapsed().as_secs_f64())
    }

    /// µs per Tgetattr with `depth` outstanding (wall time / requests).
    pub(super) fn getattr_depth_us(&mut self, depth: u16, iters: usize) -> Res<f64> {
        let frames: Vec<Vec<u8>> = (1..=depth)
            .map(|tag| {
                Tmessage::Getattr(Tgetattr {
                    fid: SMALL,
                    request_mask: GetattrMask::BASIC,
                })
                .encode_frame(tag)
            })
            .collect();
        let start = Instant::now();
        let mut sent = 0usize;
        for f in &frames {
            if sent < iters {
                self.send(f)?;
                sent += 1;
            }
        }
        for _ in 0..iters {
            let (tag, ty, _) = self.recv()?;
            if ty != MsgType::Rgetattr {
                return Err(format!("Tgetattr: reply type {ty}").into());
            }
            if sent < iters {
                self.send(&frames[usize::from(tag) - 1])?;
                sent += 1;
            }
        }
        Ok(start.elapsed().as_secs_f64() * 1e6 / iters as f64)
    }

    /// Tgetattr latencies (µs), one at a time, `iters` of them; with
    /// `slow_fid`, a blocking Tlock on it (tag 100) stays outstanding the
    /// whole time on the same connection (re-sent whenever the server
    /// answers BLOCKED).
    pub(super) fn getattr_latencies(
        &mut self,
        iters: usize,
        slow_fid: Option<u32>,
    ) -> Res<Vec<f64>> {
        const SLOW_TAG: u16 = 100;
        let getattr = Tmessage::Getattr(Tgetattr {
            fid: SMALL,
            request_mask: GetattrMask::BASIC,
        })
        .encode_frame(1);
        let tlock = slow_fid.map(|fid| {
            Tmessage::Lock(Tlock {
                fid,
                ty: LockType::Wrlck,
                flags: LockFlags::BLOCK,
                start: 0,
                length: 0,
                proc_id: 2,
                client_id: b"bench".to_vec(),
            })
            .encode_frame(SLOW_TAG)
        });
        if let Some(t) = &tlock {
            self.send(t)?;
        }
        let mut out = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t0 = Instant::now();
            self.send(&getattr)?;
            loop {
                let (tag, ty, _) = self.recv()?;
                if tag == SLOW_TAG && ty == MsgType::Rlock {
                    // BLOCKED after the server's lock wait: ask again.
                    if let Some(t) = &tlock {
                        self.send(t)?;
                    }
                    continue;
                }
                if ty != MsgType::Rgetattr {
                    return Err(format!("Tgetattr: reply type {ty}").into());
                }
                break;
            }
            out.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        if tlock.is_some() {
            // Leave the connection without an outstanding lock.
            self.send(
                &Tmessage::Flush(virtio_9p_server::protocol::Tflush { oldtag: SLOW_TAG })
                    .encode_frame(101),
            )?;
            loop {
                let (tag, _, _) = self.recv()?;
                if tag == 101 {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// µs per Twalk of one name plus the Tclunk of the new fid.
    pub(super) fn walk_clunk_us(&mut self, iters: usize) -> Res<f64> {
        let walk = Tmessage::Walk(Twalk {
            fid: ROOT,
            newfid: WALKED,
            wnames: vec![b"f".to_vec()],
        })
        .encode_frame(3);
        let clunk = Tmessage::Clunk(Tfid { fid: WALKED }).encode_frame(3);
        let start = Instant::now();
        for _ in 0..iters {
            self.call(&walk)?;
            self.call(&clunk)?;
        }
        Ok(start.elapsed().as_secs_f64() * 1e6 / iters as f64)
    }
}

/// A session on a trivial server thread that answers every Tread with a
/// canned Rread of `msize - IOHDRSZ` bytes written from memory, and
/// anything else with nothing: the ceiling of the load generator itself.
pub(super) fn trivial_session(msize: u32, file_len: u64) -> Res<Session> {
    let (ours, mut theirs) = UnixStream::pair()?;
    let count = msize - IOHDRSZ;
    let mut canned = Vec::with_capacity(11 + count as usize);
    canned.extend_from_slice(&(11 + count).to_le_bytes());
    canned.push(MsgType::Rread.into());
    canned.extend_from_slice(&[0, 0]);
    canned.extend_from_slice(&count.to_le_bytes());
    canned.resize(11 + count as usize, 0);
    std::thread::Builder::new()
        .name("trivial-9p".into())
        .spawn(move || {
            let mut frame = vec![0u8; 64 * KIB as usize];
            // Ends when the session is dropped (EOF or an error).
            while theirs.read_exact(&mut frame[..4]).is_ok() {
                let size = u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
                if !(7..=frame.len()).contains(&size)
                    || theirs.read_exact(&mut frame[4..size]).is_err()
                {
                    break;
                }
                if frame[4] == MsgType::Tread {
                    canned[5..7].copy_from_slice(&frame[5..7]);
                    if theirs.write_all(&canned).is_err() {
                        break;
                    }
                }
            }
        })?;
    Ok(Session {
        client: Client::new(StreamTransport(ours)),
        msize,
        reply: vec![0u8; msize as usize],
        offset: 0,
        file_len,
    })
}

/// Sequential reads on each of `sessions` at once, `depth` outstanding on
/// each, `total` bytes in all; aggregate GiB/s.
pub(super) fn par_read(sessions: &mut [Session], depth: u16, total: u64) -> Res<f64> {
    let per = total / sessions.len() as u64;
    let start = Instant::now();
    let results: Vec<Result<f64, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = sessions
            .iter_mut()
            .map(|se| s.spawn(move || se.read_depth(depth, per).map_err(|e| e.to_string())))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("reader panicked".into())))
            .collect()
    });
    for r in results {
        r?;
    }
    Ok(per as f64 * sessions.len() as f64 / GIB / start.elapsed().as_secs_f64())
}
