// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Transports: how requests reach the [`Server`](crate::Server).
//!
//! - [`virtio`]: the virtio-9p device core: a request queue of chains in
//!   guest memory, on the coroutine engine.
//! - `vhost_user` (feature `vhost-user`): that device as a vhost-user
//!   backend, and the loop that accepts its frontends.
//! - [`socket`]: 9P over unix and TCP sockets, for the kernel client and
//!   diod's users.
//! - [`unix`]: socket files that replace only a stale socket.

pub mod socket;
pub mod unix;
#[cfg(feature = "vhost-user")]
#[cfg_attr(docsrs, doc(cfg(feature = "vhost-user")))]
pub mod vhost_user;
pub mod virtio;
