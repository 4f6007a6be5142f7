// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The reply writer of every socket request: a [`SliceWriter`] over the
//! reply buffer, with splicing as an optional strategy for file ranges
//! (a [`Splicer`], see "Zero-copy Rread" in the module docs). Without a
//! splicer, or when it declines a range, the range is copied.

use std::io::{self, Write};
use std::os::fd::BorrowedFd;

use super::splice::Splicer;
use crate::exec::Blocking;
use crate::io::{ReplyWriter, SliceWriter};

/// The [`ReplyWriter`] of a socket request: a [`SliceWriter`] over the
/// reply buffer whose split-off data part may defer a file range to a
/// pipe.
#[derive(Debug)]
pub(crate) struct SockWriter<'a, B> {
    buf: SliceWriter<'a, B>,
    splicer: Option<&'a Splicer>,
    /// Split off the head: its bytes follow the head's.
    tail: bool,
    /// Bytes of this writer that sit in the splicer's pipe (they come
    /// before anything in `buf`, which is then empty).
    spliced: usize,
}

impl<'a, B: Blocking + Clone> SockWriter<'a, B> {
    /// A writer over `buf` for a request run on `exec`, which places its
    /// file reads; with a `splicer`, file ranges may be spliced.
    pub(crate) fn new(buf: &'a mut [u8], splicer: Option<&'a Splicer>, exec: B) -> Self {
        SockWriter {
            buf: SliceWriter::with_exec(buf, exec),
            splicer,
            tail: false,
            spliced: 0,
        }
    }

    /// Moves a spliced range back into the buffer (another write follows
    /// it), so that the bytes stay in order.
    fn materialize(&mut self) -> io::Result<()> {
        if self.spliced == 0 {
            return Ok(());
        }
        let Some(sp) = self.splicer else {
            return Ok(());
        };
        let Some(filled) = sp.take() else {
            return Err(io::Error::other("spliced range lost"));
        };
        self.spliced = 0;
        sp.read_back(filled, &mut self.buf)
    }

    /// Splices `[off, off + count)` of `file` into a pipe when this writer
    /// may defer it: a split-off data part with nothing written yet, so
    /// the range is the whole data of the reply. `None` to copy instead.
    fn try_splice(
        &mut self,
        file: BorrowedFd<'_>,
        count: usize,
        off: u64,
    ) -> Option<io::Result<usize>> {
        let sp = self.splicer?;
        if !self.tail || self.spliced > 0 || self.buf.bytes_written() > 0 {
            return None;
        }
        let r = sp.splice_range(self.buf.exec(), file, count, off)?;
        if let Ok(n) = r {
            self.spliced = n;
        }
        Some(r)
    }
}

impl<B: Blocking + Clone> Write for SockWriter<'_, B> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.materialize()?;
        self.buf.write(data)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<B: Blocking + Clone> ReplyWriter for SockWriter<'_, B> {
    fn available_bytes(&self) -> usize {
        self.buf.available_bytes().saturating_sub(self.spliced)
    }

    fn bytes_written(&self) -> usize {
        self.buf.bytes_written() + self.spliced
    }

    fn split_at(&mut self, offset: usize) -> io::Result<Self> {
        self.materialize()?;
        let buf = self.buf.split_at(offset)?;
        Ok(SockWriter {
            buf,
            splicer: self.splicer,
            tail: true,
            spliced: 0,
        })
    }

    fn write_from_file_at(
        &mut self,
        file: BorrowedFd<'_>,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        let count = count.min(self.available_bytes());
        if let Some(r) = self.try_splice(file, count, off) {
            return r;
        }
        self.materialize()?;
        self.buf.write_from_file_at(file, count, off)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek};
    use std::os::fd::AsFd;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::exec::Inline;
    use crate::transport::socket::pipes::{PipePool, SharedPipes};

    fn pool() -> SharedPipes {
        Arc::new(Mutex::new(PipePool::new(4)))
    }

    #[test]
    fn test_writer_splices_only_a_whole_tail() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        let sp = Splicer::new(pool());
        let mut buf = vec![0u8; 11 + 70_000];
        let mut head = SockWriter::new(&mut buf, Some(&sp), Inline);
        // The head itself never splices.
        let mut tail = head.split_at(11).unwrap();
        let n = tail.write_from_file_at(f.as_fd(), 70_000, 40_000).unwrap();
        assert_eq!(n, 60_000, "clamped to the file");
        assert_eq!(tail.bytes_written(), 60_000);
        let filled = sp.take().unwrap();
        assert_eq!(filled.len, 60_000);
        let mut got = vec![0u8; 60_000];
        let mut r = std::fs::File::from(filled.pipe.r.try_clone().unwrap());
        r.read_exact(&mut got).unwrap();
        assert_eq!(got, data[40_000..]);
        assert!(buf[11..].iter().all(|&b| b == 0), "nothing copied");

        // A write after the range moves it back into the buffer.
        let mut buf = vec![0u8; 11 + 70_000];
        let mut head = SockWriter::new(&mut buf, Some(&sp), Inline);
        let mut tail = head.split_at(11).unwrap();
        assert_eq!(
            tail.write_from_file_at(f.as_fd(), 32_768, 0).unwrap(),
            32_768
        );
        tail.write_all(b"xyz").unwrap();
        assert_eq!(tail.bytes_written(), 32_771);
        assert!(sp.take().is_none());
        assert_eq!(&buf[11..11 + 32_768], &data[..32_768]);
        assert_eq!(&buf[11 + 32_768..11 + 32_771], b"xyz");

        // Small ranges and ranges past the end are copied.
        let mut buf = vec![0u8; 11 + 70_000];
        let mut head = SockWriter::new(&mut buf, Some(&sp), Inline);
        let mut tail = head.split_at(11).unwrap();
        assert_eq!(tail.write_from_file_at(f.as_fd(), 1000, 5).unwrap(), 1000);
        assert!(sp.take().is_none());
        assert_eq!(&buf[11..1011], &data[5..1005]);
        f.rewind().unwrap();
    }
}
