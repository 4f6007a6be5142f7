//! Transports: how requests reach the [`Server`](crate::Server).

pub mod socket;
pub mod unix;
