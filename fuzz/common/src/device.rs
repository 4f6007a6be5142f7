// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Input of the `virtio_device` target: 9P requests carried in descriptor
//! chains into virtio-9p-server's virtio request queue.
//!
//! Each [`DeviceStep::Request`] becomes one chain laid out by
//! virtqueue-large's mock driver: the frame split over one or more
//! device-readable buffers, then device-writable buffers for the reply,
//! direct or through an indirect table. [`DeviceStep::Kick`] lets the
//! device process what is pending, so several requests can be in flight
//! at once (Tflush then has something to flush).

use crate::bytes::{ByteSink, ByteSource};
use crate::p9::{self, SessionConfig};

/// Most steps in one input.
pub const MAX_STEPS: usize = 32;
/// Most writable buffers of one chain.
pub const MAX_WRITABLE: usize = 4;

/// One step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceStep {
    /// A request chain.
    Request {
        /// The 9P frame (see [`p9::frame`]).
        frame: Vec<u8>,
        /// Readable buffers the frame is split into: `1 + pieces % 8`.
        pieces: u8,
        /// Writable buffer lengths; none means one buffer of
        /// [`p9::SERVER_MSIZE`] bytes.
        writable: Vec<u16>,
        /// Through an indirect table.
        indirect: bool,
    },
    /// The driver kicks: the device pops, serves and completes.
    Kick,
}

/// The whole input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInput {
    /// Server set-up (read-only, security model, openat2).
    pub config: SessionConfig,
    /// `VIRTIO_RING_F_INDIRECT_DESC` negotiated.
    pub indirect: bool,
    /// `VIRTIO_RING_F_EVENT_IDX` negotiated.
    pub event_idx: bool,
    /// The queue size is `4 << (queue_size_log2 % 5)` (4 to 64).
    pub queue_size_log2: u8,
    /// The steps.
    pub steps: Vec<DeviceStep>,
}

impl DeviceInput {
    /// The queue size.
    pub fn queue_size(&self) -> u16 {
        4 << (self.queue_size_log2 % 5)
    }

    /// Decodes any bytes.
    pub fn decode(data: &[u8]) -> Self {
        let mut s = ByteSource::new(data);
        let c = s.u8();
        let d = s.u8();
        let mut steps = Vec::new();
        while !s.is_empty() && steps.len() < MAX_STEPS {
            let kind = s.u8();
            if kind % 5 == 4 {
                steps.push(DeviceStep::Kick);
                continue;
            }
            let frame = p9::frame(kind, &mut s);
            let pieces = s.u8();
            let indirect = s.bool();
            let n = usize::from(s.u8()) % (MAX_WRITABLE + 1);
            let writable = (0..n).map(|_| s.u16()).collect();
            steps.push(DeviceStep::Request {
                frame,
                pieces,
                writable,
                indirect,
            });
        }
        DeviceInput {
            config: SessionConfig {
                readonly: c & 1 != 0,
                security_model: ((c >> 1) & 3) % 3,
                openat2: c & 16 == 0,
            },
            indirect: d & 1 != 0,
            event_idx: d & 2 != 0,
            queue_size_log2: (d >> 2) % 5,
            steps,
        }
    }

    /// Encodes the input (frames as raw bytes) so that
    /// [`decode`](Self::decode) gives it back.
    pub fn encode(&self) -> Vec<u8> {
        let mut k = ByteSink::new();
        let c = &self.config;
        k.u8(u8::from(c.readonly) | (c.security_model % 3) << 1 | u8::from(!c.openat2) << 4);
        k.u8(u8::from(self.indirect)
            | u8::from(self.event_idx) << 1
            | (self.queue_size_log2 % 5) << 2);
        for step in &self.steps {
            match step {
                DeviceStep::Kick => {
                    k.u8(4);
                }
                DeviceStep::Request {
                    frame,
                    pieces,
                    writable,
                    indirect,
                } => {
                    assert!(
                        writable.len() <= MAX_WRITABLE,
                        "seed with {} writable buffers",
                        writable.len()
                    );
                    k.u8(0)
                        .bytes(frame)
                        .u8(*pieces)
                        .bool(*indirect)
                        .u8(writable.len() as u8);
                    for w in writable {
                        k.u16(*w);
                    }
                }
            }
        }
        k.into_bytes()
    }
}

/// Named seeds for the `virtio_device` corpus: every session seed as one
/// chain per request with a kick after each, and variants with split
/// requests, small and fragmented reply buffers, batches and flushes.
pub fn seeds() -> Vec<(String, DeviceInput)> {
    let mut out = Vec::new();
    for (i, (name, session)) in p9::session_seeds().into_iter().enumerate() {
        let mut steps = Vec::new();
        for (j, frame) in session.frames.iter().enumerate() {
            let v = (i + j) as u8;
            steps.push(DeviceStep::Request {
                frame: frame.clone(),
                pieces: v % 3,
                writable: match v % 4 {
                    0 => Vec::new(),
                    1 => vec![11, 4096],
                    2 => vec![7, 7, 7, 60000],
                    _ => vec![64],
                },
                indirect: v % 2 == 1,
            });
            if j % 3 != 1 {
                steps.push(DeviceStep::Kick);
            }
        }
        steps.truncate(MAX_STEPS);
        out.push((
            name.to_string(),
            DeviceInput {
                config: session.config,
                indirect: true,
                event_idx: i.is_multiple_of(2),
                queue_size_log2: (i % 5) as u8,
                steps,
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_device_seeds_roundtrip_and_are_written() {
        let seeds = seeds();
        for (name, input) in &seeds {
            assert_eq!(&DeviceInput::decode(&input.encode()), input, "seed {name}");
        }
        let n = crate::corpus::write(
            "virtio_device",
            seeds.iter().map(|(n, i)| (n.as_str(), i.encode())),
        );
        assert_eq!(n, seeds.len());
    }

    #[test]
    fn test_any_bytes_decode() {
        let input = DeviceInput::decode(&[0xff; 40]);
        assert!(input.steps.len() <= MAX_STEPS);
        assert!((4..=64).contains(&input.queue_size()));
        assert_eq!(DeviceInput::decode(&[]).steps, Vec::new());
    }
}
