// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! User and group ids: squashing and translation ([`IdTranslation`], the
//! daemon's `--translate-uid`, `--translate-gid`, applied by
//! [`PassthroughFs::with_ids`](crate::PassthroughFs::with_ids); another
//! [`Filesystem`](crate::fs::Filesystem) applies it with
//! [`IdTranslation::cred`], [`IdTranslation::to_guest_attr`] and
//! [`IdTranslation::to_host_setattr`]) and the user-namespace maps of the
//! daemon's sandbox (`--uid-map`, `--gid-map`).

use std::fmt;
use std::io;
use std::str::FromStr;

use crate::fs::Cred;
use crate::protocol::{Rgetattr, SetattrMask, Tsetattr};

/// Why an id map, a translation rule or a set of rules was refused. The
/// id options' own error, so that this module and the crate's
/// [`Error`](crate::Error), which wraps it ([`Error::Id`](crate::Error::Id)),
/// do not import each other.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// A malformed user-namespace id map ([`IdMap`]).
    #[error("bad id map {input:?}: {reason}")]
    IdMap {
        /// The text given.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A malformed id translation rule ([`IdRule`]).
    #[error("bad id translation {input:?}: {reason}")]
    IdRule {
        /// The text given.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Two id translation rules translate the same ids in the same
    /// direction ([`IdRules::new`]).
    #[error("id translations {first} and {second} overlap on {side} ids")]
    IdOverlap {
        /// The earlier rule.
        first: IdRule,
        /// The later rule.
        second: IdRule,
        /// `guest` or `host`.
        side: &'static str,
    },
}

/// One line of a user-namespace id map: `:inside:outside:count:`
/// (virtiofsd's syntax) or `inside:outside:count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMap {
    /// First id inside the namespace.
    pub inside: u32,
    /// First id outside (on the host).
    pub outside: u32,
    /// Number of ids.
    pub count: u32,
}

impl FromStr for IdMap {
    type Err = IdError;
    /// virtiofsd's `:inside:outside:count:`, or our older `inside:outside:count`.
    fn from_str(s: &str) -> Result<Self, IdError> {
        let bad_map = |reason| IdError::IdMap {
            input: s.to_owned(),
            reason,
        };
        let bad = || bad_map("expected :inside:outside:count: (or inside:outside:count)");
        let body = match s.strip_prefix(':') {
            Some(rest) => rest.strip_suffix(':').ok_or_else(bad)?,
            None => s,
        };
        let parts: Vec<_> = body.split(':').collect();
        if parts.len() != 3 {
            return Err(bad());
        }
        let n = |p: &str| p.parse::<u32>().map_err(|_| bad());
        let m = IdMap {
            inside: n(parts[0])?,
            outside: n(parts[1])?,
            count: n(parts[2])?,
        };
        if m.count == 0
            || m.inside.checked_add(m.count - 1).is_none()
            || m.outside.checked_add(m.count - 1).is_none()
        {
            return Err(bad_map("empty or overflowing range"));
        }
        Ok(m)
    }
}

/// A range of ids, `first..=last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    /// First id.
    pub first: u32,
    /// Last id (inclusive).
    pub last: u32,
}

impl IdRange {
    fn new(first: u32, count: u32) -> Option<IdRange> {
        let last = first.checked_add(count.checked_sub(1)?)?;
        Some(IdRange { first, last })
    }
    fn contains(&self, id: u32) -> bool {
        (self.first..=self.last).contains(&id)
    }
    fn overlaps(&self, o: &IdRange) -> bool {
        self.first <= o.last && o.first <= self.last
    }
    fn count(&self) -> u64 {
        u64::from(self.last - self.first) + 1
    }
}

/// One id translation rule (`--translate-uid` / `--translate-gid`), in
/// virtiofsd's grammar:
///
/// | rule | meaning |
/// |---|---|
/// | `guest:GUEST:HOST:COUNT` | guest ids `GUEST..` become host ids `HOST..` (guest to host only) |
/// | `host:HOST:GUEST:COUNT` | host ids `HOST..` read as guest ids `GUEST..` (host to guest only) |
/// | `squash-guest:GUEST:HOST:COUNT` | guest ids `GUEST..` all become host id `HOST` |
/// | `squash-host:HOST:GUEST:COUNT` | host ids `HOST..` all read as guest id `GUEST` |
/// | `forbid-guest:GUEST:COUNT` | the guest may not use ids `GUEST..` (EPERM) |
/// | `map:GUEST:HOST:COUNT` | `guest:` and `host:` at once |
///
/// Our older forms `squash-guest:HOST` and `squash-host:GUEST` (every id)
/// are kept as aliases. Ids no rule covers pass unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdRule {
    /// Guest ids in `guest` become `host..` on the host.
    Guest {
        /// Guest ids.
        guest: IdRange,
        /// First host id.
        host: u32,
    },
    /// Host ids in `host` read as `guest..` in the guest.
    Host {
        /// Host ids.
        host: IdRange,
        /// First guest id.
        guest: u32,
    },
    /// Guest ids in `guest` all become host id `host`.
    SquashGuest {
        /// Guest ids.
        guest: IdRange,
        /// The host id.
        host: u32,
    },
    /// Host ids in `host` all read as guest id `guest`.
    SquashHost {
        /// Host ids.
        host: IdRange,
        /// The guest id.
        guest: u32,
    },
    /// The guest may not use ids in `guest`: requests that set one fail
    /// with `EPERM`.
    ForbidGuest {
        /// Guest ids.
        guest: IdRange,
    },
    /// Guest ids in `guest` are host ids `host..`, both ways.
    Map {
        /// Guest ids.
        guest: IdRange,
        /// First host id.
        host: u32,
    },
}

const ALL_IDS: IdRange = IdRange {
    first: 0,
    last: u32::MAX,
};

impl FromStr for IdRule {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        let bad_rule = |reason| IdError::IdRule {
            input: s.to_owned(),
            reason,
        };
        let bad = || {
            bad_rule(
                "expected guest:GUEST:HOST:COUNT, host:HOST:GUEST:COUNT, \
                 squash-guest:GUEST:HOST:COUNT, squash-host:HOST:GUEST:COUNT, \
                 forbid-guest:GUEST:COUNT or map:GUEST:HOST:COUNT",
            )
        };
        let mut parts = s.split(':');
        let kind = parts.next().ok_or_else(bad)?;
        let nums = parts
            .map(|p| p.parse::<u32>().map_err(|_| bad()))
            .collect::<Result<Vec<u32>, IdError>>()?;
        let range = |first: u32, count: u32| {
            IdRange::new(first, count)
                .ok_or_else(|| bad_rule("the range is empty or passes 4294967295"))
        };
        // The range a target base must also fit: `base..base+count`.
        let target = |base: u32, r: IdRange| {
            base.checked_add(r.last - r.first)
                .map(|_| base)
                .ok_or_else(|| bad_rule("the target range passes 4294967295"))
        };
        Ok(match (kind, nums.as_slice()) {
            ("squash-guest", &[host]) => IdRule::SquashGuest {
                guest: ALL_IDS,
                host,
            },
            ("squash-host", &[guest]) => IdRule::SquashHost {
                host: ALL_IDS,
                guest,
            },
            ("guest", &[g, h, n]) => {
                let guest = range(g, n)?;
                IdRule::Guest {
                    guest,
                    host: target(h, guest)?,
                }
            }
            ("host", &[h, g, n]) => {
                let host = range(h, n)?;
                IdRule::Host {
                    host,
                    guest: target(g, host)?,
                }
            }
            ("map", &[g, h, n]) => {
                let guest = range(g, n)?;
                IdRule::Map {
                    guest,
                    host: target(h, guest)?,
                }
            }
            ("squash-guest", &[g, host, n]) => IdRule::SquashGuest {
                guest: range(g, n)?,
                host,
            },
            ("squash-host", &[h, guest, n]) => IdRule::SquashHost {
                host: range(h, n)?,
                guest,
            },
            ("forbid-guest", &[g, n]) => IdRule::ForbidGuest {
                guest: range(g, n)?,
            },
            _ => return Err(bad()),
        })
    }
}

impl fmt::Display for IdRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            IdRule::Guest { guest, host } => {
                write!(f, "guest:{}:{host}:{}", guest.first, guest.count())
            }
            IdRule::Host { host, guest } => {
                write!(f, "host:{}:{guest}:{}", host.first, host.count())
            }
            IdRule::SquashGuest { guest, host } if guest == ALL_IDS => {
                write!(f, "squash-guest:{host}")
            }
            IdRule::SquashHost { host, guest } if host == ALL_IDS => {
                write!(f, "squash-host:{guest}")
            }
            IdRule::SquashGuest { guest, host } => {
                write!(f, "squash-guest:{}:{host}:{}", guest.first, guest.count())
            }
            IdRule::SquashHost { host, guest } => {
                write!(f, "squash-host:{}:{guest}:{}", host.first, host.count())
            }
            IdRule::ForbidGuest { guest } => {
                write!(f, "forbid-guest:{}:{}", guest.first, guest.count())
            }
            IdRule::Map { guest, host } => {
                write!(f, "map:{}:{host}:{}", guest.first, guest.count())
            }
        }
    }
}

impl IdRule {
    /// The guest ids this rule translates to the host, if any.
    fn guest_range(&self) -> Option<IdRange> {
        match *self {
            IdRule::Guest { guest, .. }
            | IdRule::SquashGuest { guest, .. }
            | IdRule::ForbidGuest { guest }
            | IdRule::Map { guest, .. } => Some(guest),
            IdRule::Host { .. } | IdRule::SquashHost { .. } => None,
        }
    }

    /// The host ids this rule translates to the guest, if any.
    fn host_range(&self) -> Option<IdRange> {
        match *self {
            IdRule::Host { host, .. } | IdRule::SquashHost { host, .. } => Some(host),
            IdRule::Map { guest, host } => Some(IdRange {
                first: host,
                last: host.saturating_add(guest.last - guest.first),
            }),
            IdRule::Guest { .. } | IdRule::SquashGuest { .. } | IdRule::ForbidGuest { .. } => None,
        }
    }
}

/// The rules of one id kind (uids or gids), checked for overlaps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdRules(Vec<IdRule>);

impl IdRules {
    /// Checks that no two rules translate the same id in the same
    /// direction: which of two rules would apply would depend on their order.
    pub fn new(rules: Vec<IdRule>) -> Result<IdRules, IdError> {
        for (i, a) in rules.iter().enumerate() {
            for b in &rules[..i] {
                let clash = |x: Option<IdRange>, y: Option<IdRange>| matches!((x, y), (Some(x), Some(y)) if x.overlaps(&y));
                if clash(a.guest_range(), b.guest_range()) {
                    return Err(IdError::IdOverlap {
                        first: *b,
                        second: *a,
                        side: "guest",
                    });
                }
                if clash(a.host_range(), b.host_range()) {
                    return Err(IdError::IdOverlap {
                        first: *b,
                        second: *a,
                        side: "host",
                    });
                }
            }
        }
        Ok(IdRules(rules))
    }

    /// The rules.
    pub fn rules(&self) -> &[IdRule] {
        &self.0
    }

    /// A guest id as the host sees it; `EPERM` for a forbidden id.
    pub fn to_host(&self, id: u32) -> io::Result<u32> {
        for r in &self.0 {
            match *r {
                IdRule::Guest { guest, host } | IdRule::Map { guest, host }
                    if guest.contains(id) =>
                {
                    return Ok(host.saturating_add(id - guest.first));
                }
                IdRule::SquashGuest { guest, host } if guest.contains(id) => return Ok(host),
                IdRule::ForbidGuest { guest } if guest.contains(id) => {
                    return Err(io::Error::from_raw_os_error(libc::EPERM));
                }
                _ => {}
            }
        }
        Ok(id)
    }

    /// A host id as the guest sees it.
    pub fn to_guest(&self, id: u32) -> u32 {
        for r in &self.0 {
            match *r {
                IdRule::Host { host, guest } if host.contains(id) => {
                    return guest.saturating_add(id - host.first);
                }
                IdRule::SquashHost { host, guest } if host.contains(id) => return guest,
                IdRule::Map { guest, host } => {
                    let span = guest.last - guest.first;
                    if (host..=host.saturating_add(span)).contains(&id) {
                        return guest.first.saturating_add(id - host);
                    }
                }
                _ => {}
            }
        }
        id
    }
}

/// How ids cross between guest and host (`#[non_exhaustive]`: start
/// from [`IdTranslation::default`], the identity).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct IdTranslation {
    /// For uids.
    pub uid: IdRules,
    /// For gids.
    pub gid: IdRules,
}

impl IdTranslation {
    /// Whether nothing is translated.
    pub fn is_identity(&self) -> bool {
        self.uid.0.is_empty() && self.gid.0.is_empty()
    }

    /// The host credentials of a guest's; `EPERM` for a forbidden id.
    pub fn cred(&self, c: Cred) -> io::Result<Cred> {
        Ok(Cred {
            uid: self.uid.to_host(c.uid)?,
            gid: self.gid.to_host(c.gid)?,
        })
    }

    /// Turns host ownership in `a` into the guest's view.
    pub fn to_guest_attr(&self, a: &mut Rgetattr) {
        a.uid = self.uid.to_guest(a.uid);
        a.gid = self.gid.to_guest(a.gid);
    }

    /// The Tsetattr with the ownership it sets in host ids; `EPERM` for a
    /// forbidden id.
    pub fn to_host_setattr(&self, attr: &Tsetattr) -> io::Result<Tsetattr> {
        let mut a = attr.clone();
        if a.valid.contains(SetattrMask::UID) {
            a.uid = self.uid.to_host(a.uid)?;
        }
        if a.valid.contains(SetattrMask::GID) {
            a.gid = self.gid.to_host(a.gid)?;
        }
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(list: &[&str]) -> IdRules {
        IdRules::new(list.iter().map(|r| r.parse().unwrap()).collect()).unwrap()
    }

    #[test]
    fn test_id_map_syntaxes() {
        let want = IdMap {
            inside: 0,
            outside: 1000,
            count: 1,
        };
        assert_eq!(":0:1000:1:".parse::<IdMap>().unwrap(), want);
        assert_eq!("0:1000:1".parse::<IdMap>().unwrap(), want);
        for bad in [
            "",
            ":",
            "::",
            ":0:1000:1",
            "0:1000:1:",
            ":0:1000:",
            "0:1000",
            "0:1000:1:2",
            ":0:1000:1:2:",
            " 0:1000:1",
            "0:-1:1",
            "0:x:1",
            ":0:1000:0:",
            "4294967295:0:2",
            "0:4294967295:2",
            "0:0:4294967296",
        ] {
            let e = bad.parse::<IdMap>().unwrap_err().to_string();
            assert!(e.starts_with("bad id map"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn test_translate_grammar_of_virtiofsd() {
        let r: IdRule = "guest:1000:2000:10".parse().unwrap();
        assert_eq!(
            r,
            IdRule::Guest {
                guest: IdRange {
                    first: 1000,
                    last: 1009
                },
                host: 2000
            }
        );
        for text in [
            "guest:1000:2000:10",
            "host:0:1000:1",
            "squash-guest:0:1000:4294967295",
            "squash-host:1:65534:100",
            "forbid-guest:0:1",
            "map:0:1000:65536",
            "squash-guest:1000",
            "squash-host:0",
        ] {
            let r: IdRule = text.parse().unwrap();
            assert_eq!(r.to_string(), text);
        }
        // The alias covers every id.
        assert_eq!(
            "squash-guest:7".parse::<IdRule>().unwrap(),
            IdRule::SquashGuest {
                guest: ALL_IDS,
                host: 7
            }
        );
    }

    #[test]
    fn test_translate_bad_input_is_refused() {
        for bad in [
            "",
            ":",
            "squash",
            "squash:1",
            "squash-guest:x",
            "squash-guest:1:2",
            "guest:1:2",
            "guest:1:2:3:4",
            "guest:1:2:0",
            "forbid-guest:1",
            "forbid-guest:1:2:3",
            "map:4294967295:0:2",
            "map:0:4294967295:2",
            "host:0:4294967295:2",
            "guest:-1:0:1",
            "Guest:0:0:1",
            "map:0:0:99999999999",
            "map: 0:0:1",
        ] {
            let e = bad.parse::<IdRule>().unwrap_err().to_string();
            assert!(e.starts_with("bad id translation"), "{bad:?}: {e}");
        }
        // The count may reach the last id exactly.
        assert!("squash-host:4294967295:0:1".parse::<IdRule>().is_ok());
    }

    #[test]
    fn test_overlapping_rules_are_refused() {
        let r = |s: &str| s.parse::<IdRule>().unwrap();
        let e = IdRules::new(vec![r("map:0:1000:10"), r("forbid-guest:5:1")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("overlap on guest ids"), "{e}");
        let e = IdRules::new(vec![r("map:0:1000:10"), r("host:1005:0:1")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("overlap on host ids"), "{e}");
        // Different directions may cover the same ids.
        IdRules::new(vec![r("guest:0:1000:10"), r("host:0:1000:10")]).unwrap();
    }

    #[test]
    fn test_translation_rules() {
        let u = rules(&[
            "map:0:1000:1",
            "forbid-guest:1:10",
            "squash-guest:100:65534:100",
            "squash-host:2000:99:10",
            "host:5000:50:2",
        ]);
        assert_eq!(u.to_host(0).unwrap(), 1000);
        assert_eq!(u.to_guest(1000), 0);
        assert_eq!(u.to_host(5).unwrap_err().raw_os_error(), Some(libc::EPERM));
        assert_eq!(u.to_host(150).unwrap(), 65534);
        assert_eq!(u.to_host(300).unwrap(), 300);
        assert_eq!(u.to_guest(2005), 99);
        assert_eq!(u.to_guest(5001), 51);
        assert_eq!(u.to_guest(5002), 5002);
        let t = IdTranslation {
            uid: rules(&["squash-guest:1000"]),
            gid: rules(&["squash-host:0"]),
        };
        assert_eq!(
            t.cred(Cred { uid: 5, gid: 6 }).unwrap(),
            Cred { uid: 1000, gid: 6 }
        );
        assert_eq!(t.gid.to_guest(77), 0);
        assert_eq!(t.uid.to_guest(77), 77);
        assert!(IdTranslation::default().is_identity());
        let f = IdTranslation {
            uid: rules(&["forbid-guest:0:1"]),
            gid: IdRules::default(),
        };
        assert!(f.cred(Cred { uid: 0, gid: 0 }).is_err());
    }

    #[test]
    fn test_extreme_rules_do_not_overflow() {
        let u = rules(&["map:0:4294967295:1", "host:4294967294:4294967295:1"]);
        assert_eq!(u.to_host(0).unwrap(), u32::MAX);
        assert_eq!(u.to_guest(u32::MAX), 0);
        assert_eq!(u.to_guest(u32::MAX - 1), u32::MAX);
        assert_eq!(u.to_host(u32::MAX).unwrap(), u32::MAX);
    }
}
