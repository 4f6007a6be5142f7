// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Socket transports: 9P over a stream socket, without virtio.
//!
//! - [`socket`]: 9P over unix and TCP sockets, for the kernel client and
//!   diod's users.
//! - [`unix`]: socket files that replace only a stale socket.
//!
//! The virtio device core is [`crate::virtio`], and its vhost-user backend
//! `crate::vhost_user` (feature `vhost-user`).

pub mod socket;
pub mod unix;
