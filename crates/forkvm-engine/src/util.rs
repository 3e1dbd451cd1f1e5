//! Small helpers: ids, timestamps, process memory.

use std::time::{SystemTime, UNIX_EPOCH};

use forkvm_api::MemoryUsage;

/// A new id: `PREFIX-` and 12 random hex digits. Sandbox and snapshot ids
/// go through [`node_id`], which puts the daemon's node name in them.
pub fn new_id(prefix: &str) -> String {
    let mut b = [0u8; 6];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_err()
    {
        let n = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        b.copy_from_slice(&n.to_le_bytes()[..6]);
    }
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{prefix}-{hex}")
}

/// The longest node name (`serve --node`): a sandbox id stays at most 32
/// characters (`sb-` + 16 + `-` + 12), so its socket paths
/// (`<home>/sandboxes/<id>/volumes.sock`) keep room under the 108-byte
/// limit of a unix socket path.
pub const MAX_NODE_NAME: usize = 16;

/// Check a node name: 1 to [`MAX_NODE_NAME`] characters of `[a-z0-9]`,
/// starting with a letter. No `-`: a cluster gateway finds an id's node
/// by splitting the id on `-` (three parts: the middle one).
pub fn check_node_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NODE_NAME
        && name.as_bytes()[0].is_ascii_lowercase()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid node name (--node, FORKVM_NODE): use 1 to {MAX_NODE_NAME} \
             characters of a-z and 0-9, starting with a letter (for example n1)"
        ))
    }
}

/// A new sandbox (`sb`) or snapshot (`sn`) id: with a node name
/// `PREFIX-NODE-<12 hex>`, else `PREFIX-<12 hex>`.
pub fn node_id(prefix: &str, node: Option<&str>) -> String {
    match node {
        Some(n) => new_id(&format!("{prefix}-{n}")),
        None => new_id(prefix),
    }
}

/// The node an id names (`PREFIX-NODE-HEX`), if it has one.
pub fn node_of(id: &str) -> Option<&str> {
    let mut parts = id.split('-');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(_), Some(n), Some(_), None) => Some(n),
        _ => None,
    }
}

/// True for ids this daemon could have made; anything else is rejected
/// before it reaches a path.
pub fn valid_id(id: &str) -> bool {
    id.len() <= 64
        && !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Now as RFC 3339 UTC with milliseconds.
pub fn now_rfc3339() -> String {
    rfc3339(SystemTime::now())
}

/// Format a time as RFC 3339 UTC.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, day) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Parse what [`rfc3339`] writes (UTC, `Z`, optional fraction of a
/// second); `None` for anything else.
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || !s.ends_with('Z') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let frac = &s[19..s.len() - 1];
    let nanos = match frac.strip_prefix('.') {
        None if frac.is_empty() => 0,
        Some(f) if !f.is_empty() && f.len() <= 9 && f.bytes().all(|c| c.is_ascii_digit()) => {
            f.parse::<u32>().ok()? * 10u32.pow(9 - f.len() as u32)
        }
        _ => return None,
    };
    let secs = days_from_civil(y, mo as u32, d as u32) * 86_400 + h * 3600 + mi * 60 + sec;
    let secs = u64::try_from(secs).ok()?;
    Some(UNIX_EPOCH + std::time::Duration::new(secs, nanos))
}

/// (year, month, day) to days since 1970-01-01: the inverse of
/// [`civil_from_days`].
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// RSS, PSS and private dirty memory of a process, from smaps_rollup.
pub fn memory_usage(pid: u32) -> Option<MemoryUsage> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    Some(parse_smaps_rollup(&text))
}

fn parse_smaps_rollup(text: &str) -> MemoryUsage {
    let mut m = MemoryUsage::default();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(key), Some(val)) = (it.next(), it.next()) else {
            continue;
        };
        let Ok(v) = val.parse::<u64>() else { continue };
        match key {
            "Rss:" => m.rss_kib = v,
            "Pss:" => m.pss_kib = v,
            "Private_Dirty:" => m.private_dirty_kib = v,
            _ => {}
        }
    }
    m
}

/// Host RAM in MiB.
pub fn host_memory_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map(|kib| kib / 1024)
        .unwrap_or(4096)
}

/// The last `max` bytes of a file, as lossy UTF-8.
pub fn tail_file(path: &std::path::Path, max: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
    let mut buf = Vec::new();
    let _ = f.take(max).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// Milliseconds, rounded to two decimals (the API's timing unit).
pub fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1000.0 * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_795_305_600_123);
        assert_eq!(rfc3339(t), "2026-11-22T00:00:00.123Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn rfc3339_parses_what_it_formats() {
        for ms in [0u64, 951_782_400_000, 1_795_305_600_123, 4_102_444_799_999] {
            let t = UNIX_EPOCH + Duration::from_millis(ms);
            assert_eq!(parse_rfc3339(&rfc3339(t)), Some(t), "{}", rfc3339(t));
        }
        assert_eq!(
            parse_rfc3339("2026-11-22T00:00:00Z"),
            Some(UNIX_EPOCH + Duration::from_secs(1_795_305_600))
        );
        for bad in [
            "",
            "t1",
            "2026-11-22 00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-11-22T00:00:00.Z",
            "2026-11-22T00:00:00+01:00",
            "+026-11-22T00:00:00Z",
            "1969-12-31T23:59:59Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn ids_are_unique_and_valid() {
        let a = new_id("sb");
        let b = new_id("sb");
        assert_ne!(a, b);
        assert!(valid_id(&a) && a.starts_with("sb-") && a.len() == 15);
        assert!(!valid_id("../etc"));
        assert!(!valid_id(""));
        assert!(!valid_id(&"a".repeat(65)));
    }

    #[test]
    fn node_names_are_checked_and_carried_by_ids() {
        for ok in ["n1", "a", "node0", "abcdefghij012345"] {
            assert_eq!(check_node_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "1n",
            "N1",
            "n-1",
            "n_1",
            "n.1",
            "abcdefghij0123456",
            "n 1",
            "nö",
        ] {
            let e = check_node_name(bad).unwrap_err();
            assert!(e.contains("a-z and 0-9"), "{bad:?}: {e}");
        }
        let a = node_id("sb", Some("n1"));
        assert!(
            a.starts_with("sb-n1-") && a.len() == 18 && valid_id(&a),
            "{a}"
        );
        assert_eq!(node_of(&a), Some("n1"));
        let s = node_id("sn", Some("abcdefghij012345"));
        assert_eq!(s.len(), 32);
        assert_eq!(node_of(&s), Some("abcdefghij012345"));
        let plain = node_id("sb", None);
        assert!(plain.starts_with("sb-") && plain.len() == 15);
        assert_eq!(node_of(&plain), None);
        // The host end of a sandbox's uplink is named by the id's last 12
        // alphanumerics: the random part, whatever the node, within 15 bytes.
        let ifname = forkvm_net::host_if_name(&a);
        assert_eq!(ifname, format!("fvh{}", &a[a.len() - 12..]));
        assert!(ifname.len() <= 15);
        let longest = forkvm_net::host_if_name(&s);
        assert_eq!(longest, format!("fvh{}", &s[s.len() - 12..]));
    }

    #[test]
    fn smaps_rollup_parses() {
        let m = parse_smaps_rollup(
            "00400000-7ffd [rollup]\nRss:  100 kB\nPss:  60 kB\nPrivate_Dirty:  7 kB\nbogus\n",
        );
        assert_eq!((m.rss_kib, m.pss_kib, m.private_dirty_kib), (100, 60, 7));
    }
}
