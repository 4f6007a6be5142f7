// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A total byte decoder and its inverse.
//!
//! [`ByteSource`] turns any byte string into values: reads past the end
//! yield zeros, so every fuzz input decodes to *something* and libFuzzer's
//! mutations never hit a parse error in the harness itself. [`ByteSink`]
//! writes the same format, so unit tests can build seeds from typed values
//! and check that they decode back unchanged.

/// Reads little-endian values from fuzz bytes; never fails.
#[derive(Debug, Clone)]
pub struct ByteSource<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> ByteSource<'a> {
    /// A source over `data`.
    pub fn new(data: &'a [u8]) -> Self {
        ByteSource { data, pos: 0 }
    }

    /// Whether every byte has been consumed.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// Bytes not consumed yet.
    pub fn remaining(&self) -> usize {
        self.data.len().saturating_sub(self.pos)
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.remaining());
        out[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        out
    }

    /// One byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    /// A little-endian `u16`.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    /// A flag: the low bit of one byte.
    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A `u16` length (clamped to `max` and to the bytes left) followed by
    /// that many bytes.
    pub fn bytes(&mut self, max: usize) -> &'a [u8] {
        let len = usize::from(self.u16()).min(max).min(self.remaining());
        let out = &self.data[self.pos..self.pos + len];
        self.pos += len;
        out
    }

    /// Everything not consumed yet.
    pub fn rest(&mut self) -> &'a [u8] {
        let out = &self.data[self.pos.min(self.data.len())..];
        self.pos = self.data.len();
        out
    }
}

/// Writes values in the format [`ByteSource`] reads.
#[derive(Debug, Clone, Default)]
pub struct ByteSink {
    out: Vec<u8>,
}

impl ByteSink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// The bytes written.
    pub fn into_bytes(self) -> Vec<u8> {
        self.out
    }

    /// One byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.out.push(v);
        self
    }

    /// A little-endian `u16`.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A flag.
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(u8::from(v))
    }

    /// A `u16` length and the bytes. Panics if `v` is longer than 65535
    /// bytes: seeds are written by tests, which keep them short.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        let len = u16::try_from(v.len()).expect("seed field longer than 65535 bytes");
        self.u16(len);
        self.out.extend_from_slice(v);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_source_reads_zeros_past_end() {
        let mut s = ByteSource::new(&[1, 2, 3]);
        assert_eq!(s.u16(), 0x0201);
        assert_eq!(s.u32(), 3);
        assert!(s.is_empty());
        assert_eq!(s.u64(), 0);
        assert_eq!(s.bytes(10), b"");
    }

    #[test]
    fn test_bytes_clamped_to_max_and_remaining() {
        let mut s = ByteSource::new(&[9, 0, b'a', b'b', b'c']);
        assert_eq!(s.bytes(2), b"ab");
        assert_eq!(s.rest(), b"c");
        let mut s = ByteSource::new(&[9, 0, b'a']);
        assert_eq!(s.bytes(100), b"a");
    }

    #[test]
    fn test_sink_roundtrip() {
        let mut k = ByteSink::new();
        k.u8(7)
            .u16(0xbeef)
            .u32(5)
            .u64(u64::MAX)
            .bool(true)
            .bytes(b"xyz");
        let bytes = k.into_bytes();
        let mut s = ByteSource::new(&bytes);
        assert_eq!(
            (s.u8(), s.u16(), s.u32(), s.u64(), s.bool(), s.bytes(8)),
            (7, 0xbeef, 5, u64::MAX, true, &b"xyz"[..])
        );
        assert!(s.is_empty());
    }
}
