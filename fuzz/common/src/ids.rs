// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Inputs of the `id_options` target: the text of `--uid-map` /
//! `--gid-map` and `--translate-uid` / `--translate-gid` values, one per
//! line, as an operator (or a script copied from virtiofsd) writes them.

use virtio_9p_server::fs::ids::{IdMap, IdRule, IdRules};

/// Seeds: each syntax of both options, the aliases and near misses.
pub const SEEDS: &[(&str, &str)] = &[
    ("uid-map-virtiofsd", ":0:1000:1:\n:1:100000:65536:"),
    ("uid-map-ours", "0:1000:1"),
    (
        "translate-all-kinds",
        "guest:1000:2000:10\nhost:0:1000:1\nsquash-guest:100:65534:100\n\
         squash-host:2000:99:10\nforbid-guest:5000:10\nmap:7000:8000:10",
    ),
    ("translate-aliases", "squash-guest:1000\nsquash-host:0"),
    ("translate-overlap", "map:0:1000:10\nforbid-guest:5:1"),
    (
        "translate-extremes",
        "map:0:4294967295:1\nhost:4294967295:0:1",
    ),
    ("bad", "map:4294967295:0:2\n::\nguest:1:2:0\nforbid-guest:1"),
];

/// Parses every line of `text` both ways and checks the results: a
/// parsed rule prints back to text that parses to the same rule, a valid
/// map has a non-empty range that fits in `u32`, and translating any id
/// through an accepted rule set never panics. Returns the number of lines
/// that parsed as a map or a rule.
pub fn check(text: &str) -> usize {
    let mut rules = Vec::new();
    let mut ok = 0;
    for line in text.lines() {
        if let Ok(m) = line.parse::<IdMap>() {
            assert!(m.count > 0);
            assert!(m.inside.checked_add(m.count - 1).is_some());
            assert!(m.outside.checked_add(m.count - 1).is_some());
            ok += 1;
        }
        match line.parse::<IdRule>() {
            Ok(r) => {
                let back: IdRule = r.to_string().parse().expect("printed rule parses");
                assert_eq!(back, r, "{line:?}");
                rules.push(r);
                ok += 1;
            }
            Err(e) => assert!(e.to_string().starts_with("bad id translation"), "{e}"),
        }
    }
    if let Ok(set) = IdRules::new(rules) {
        let mut ids = vec![0, 1, u32::MAX - 1, u32::MAX];
        for r in set.rules() {
            for part in r.to_string().split(':').skip(1) {
                if let Ok(n) = part.parse::<u32>() {
                    ids.extend([n, n.wrapping_sub(1), n.wrapping_add(1)]);
                }
            }
        }
        for id in ids {
            let _ = set.to_host(id);
            let _ = set.to_guest(id);
        }
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_id_option_seeds_check_and_are_written() {
        let parsed: Vec<usize> = SEEDS.iter().map(|(_, s)| check(s)).collect();
        // Every good seed line parses; the bad seed has none that does.
        assert_eq!(parsed, [2, 1, 6, 2, 2, 2, 0]);
        crate::corpus::write(
            "id_options",
            SEEDS.iter().map(|(n, s)| (*n, s.as_bytes().to_vec())),
        );
    }
}
