// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Wire primitives: little-endian integers, 9P strings and qids.
//!
//! [`Decoder`] reads from a byte slice and never panics: every read checks
//! the bytes left and reports [`DecodeError::Truncated`]. [`Encoder`] appends
//! to a `Vec<u8>`.

use super::{DecodeError, Qid, MAX_NAME_LEN, MAX_PATH_LEN, QID_SIZE};

/// A strict reader over the body of one message.
#[derive(Debug)]
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Decoder<'a> {
    /// A decoder over `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Decoder { buf, pos: 0 }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Takes the next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::Truncated {
                needed: n,
                left: self.remaining(),
            });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    /// One byte.
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    /// A little-endian `u16`.
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A 9P string: `len[2]` then `len` bytes. NUL bytes are refused since
    /// no 9P2000.L string (name, path, xattr name, uname) can carry one to
    /// the host.
    pub fn string(&mut self) -> Result<Vec<u8>, DecodeError> {
        let len = self.u16()? as usize;
        let bytes = self.bytes(len)?;
        if bytes.contains(&0) {
            return Err(DecodeError::NulInString);
        }
        Ok(bytes.to_vec())
    }

    /// A file name (a Twalk element or the name of a new entry): a 9P
    /// string of at most [`MAX_NAME_LEN`] bytes, checked before anything is
    /// copied, so a request cannot make the server hold 64 KiB names.
    pub fn name(&mut self) -> Result<Vec<u8>, DecodeError> {
        self.bounded(MAX_NAME_LEN, DecodeError::NameTooLong)
    }

    /// An xattr name: at most [`MAX_NAME_LEN`] bytes (Linux's
    /// `XATTR_NAME_MAX`).
    pub fn xattr_name(&mut self) -> Result<Vec<u8>, DecodeError> {
        self.bounded(MAX_NAME_LEN, DecodeError::XattrNameTooLong)
    }

    /// A path-like string (symlink target, uname, aname, lock client id,
    /// version): at most [`MAX_PATH_LEN`] bytes.
    pub fn path(&mut self) -> Result<Vec<u8>, DecodeError> {
        self.bounded(MAX_PATH_LEN, DecodeError::PathTooLong)
    }

    fn bounded(
        &mut self,
        max: usize,
        err: fn(usize) -> DecodeError,
    ) -> Result<Vec<u8>, DecodeError> {
        let len = self.peek_u16()? as usize;
        if len > max {
            return Err(err(len));
        }
        self.string()
    }

    fn peek_u16(&self) -> Result<u16, DecodeError> {
        match self.buf.get(self.pos..self.pos + 2) {
            Some(b) => Ok(u16::from_le_bytes([b[0], b[1]])),
            None => Err(DecodeError::Truncated {
                needed: 2,
                left: self.remaining(),
            }),
        }
    }

    /// A qid: `type[1] version[4] path[8]`.
    pub fn qid(&mut self) -> Result<Qid, DecodeError> {
        let raw = self.array::<QID_SIZE>()?;
        Ok(Qid::from_bytes(&raw))
    }

    /// Checks that the whole body was consumed.
    pub fn finish(self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(DecodeError::TrailingBytes(n)),
        }
    }
}

/// Appends wire values to a buffer.
#[derive(Debug)]
pub struct Encoder<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> Encoder<'a> {
    /// An encoder appending to `out`.
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        Encoder { out }
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

    /// Raw bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.out.extend_from_slice(v);
        self
    }

    /// A 9P string. Strings longer than `u16::MAX` are truncated at a
    /// byte boundary; callers keep names far below that (see
    /// [`super::MAX_STRING_LEN`]).
    pub fn string(&mut self, v: &[u8]) -> &mut Self {
        let v = &v[..v.len().min(u16::MAX as usize)];
        self.u16(v.len() as u16);
        self.bytes(v)
    }

    /// A qid.
    pub fn qid(&mut self, q: &Qid) -> &mut Self {
        self.bytes(&q.to_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_decoder_truncated_reports_need() {
        let mut d = Decoder::new(&[1, 2, 3]);
        assert_eq!(
            d.u32().unwrap_err(),
            DecodeError::Truncated { needed: 4, left: 3 }
        );
    }

    #[test]
    fn test_decoder_string_refuses_nul() {
        let mut d = Decoder::new(&[2, 0, b'a', 0]);
        assert_eq!(d.string().unwrap_err(), DecodeError::NulInString);
    }

    #[test]
    fn test_decoder_name_limit_checked_before_copy() {
        let mut ok = vec![255, 0];
        ok.extend(std::iter::repeat_n(b'a', 255));
        assert_eq!(Decoder::new(&ok).name().unwrap().len(), 255);
        // Only the length field is there: the limit is checked first.
        assert_eq!(
            Decoder::new(&[0, 1]).name().unwrap_err(),
            DecodeError::NameTooLong(256)
        );
        assert_eq!(
            Decoder::new(&[0, 1]).xattr_name().unwrap_err(),
            DecodeError::XattrNameTooLong(256)
        );
        assert_eq!(
            Decoder::new(&[1, 16]).path().unwrap_err(),
            DecodeError::PathTooLong(4097)
        );
        assert_eq!(
            Decoder::new(&[1]).name().unwrap_err(),
            DecodeError::Truncated { needed: 2, left: 1 }
        );
    }

    #[test]
    fn test_decoder_finish_reports_trailing() {
        let mut d = Decoder::new(&[1, 2, 3]);
        d.u8().unwrap();
        assert_eq!(d.finish().unwrap_err(), DecodeError::TrailingBytes(2));
    }

    #[test]
    fn test_encoder_le_layout() {
        let mut v = Vec::new();
        Encoder::new(&mut v)
            .u16(0x0102)
            .u32(0x03040506)
            .string(b"ab");
        assert_eq!(v, [2, 1, 6, 5, 4, 3, 2, 0, b'a', b'b']);
    }
}
