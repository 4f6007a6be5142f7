// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Transports: how requests reach the [`Server`](crate::Server).

pub mod socket;

pub mod unix;
