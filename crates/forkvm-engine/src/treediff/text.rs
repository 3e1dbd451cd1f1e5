//! Text in diffs and merges: which files count as text, unified diffs
//! (`diffy`), and three-way line merges.

use super::compare::Node;

/// Text files larger than this are shown as changed, without a patch.
pub const MAX_TEXT: u64 = 1 << 20;

/// A regular file small enough to be shown as text.
pub fn worth_reading(n: Option<&Node>) -> bool {
    n.is_some_and(|n| n.kind == "file" && n.size <= MAX_TEXT)
}

/// `b` as text, if it is: UTF-8 without NUL bytes.
pub fn as_text(b: &[u8]) -> Option<&str> {
    if b.contains(&0) {
        return None;
    }
    std::str::from_utf8(b).ok()
}

/// A unified diff from `a` to `b` (either may be absent: an added or
/// deleted file), or `None` when a side is not text.
pub fn patch(path: &str, a: Option<&Vec<u8>>, b: Option<&Vec<u8>>) -> Option<String> {
    let ta = match a {
        Some(x) => as_text(x)?,
        None => "",
    };
    let tb = match b {
        Some(x) => as_text(x)?,
        None => "",
    };
    if a.is_none() && b.is_none() {
        return None;
    }
    let p = diffy::create_patch(ta, tb).to_string();
    // diffy names the sides `original` and `modified`: name them as git does.
    let body: String = p.lines().skip(2).map(|l| format!("{l}\n")).collect();
    let from = if a.is_some() {
        format!("a{path}")
    } else {
        "/dev/null".into()
    };
    let to = if b.is_some() {
        format!("b{path}")
    } else {
        "/dev/null".into()
    };
    Some(format!("--- {from}\n+++ {to}\n{body}"))
}

/// Merge `ours` and `theirs`, both changed from `base`, line by line;
/// `None` when they overlap (or a side is not text).
pub fn merge3(base: &[u8], ours: &[u8], theirs: &[u8]) -> Option<Vec<u8>> {
    let (b, o, t) = (as_text(base)?, as_text(ours)?, as_text(theirs)?);
    diffy::merge(b, o, t).ok().map(String::into_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patches_name_the_sides_like_git() {
        let p = patch(
            "/r/a.txt",
            Some(&b"one\ntwo\n".to_vec()),
            Some(&b"one\n2\n".to_vec()),
        )
        .unwrap();
        assert!(p.starts_with("--- a/r/a.txt\n+++ b/r/a.txt\n@@"), "{p}");
        assert!(p.contains("-two\n+2\n"), "{p}");
        let added = patch("/n", None, Some(&b"x\n".to_vec())).unwrap();
        assert!(added.starts_with("--- /dev/null\n+++ b/n\n"), "{added}");
        assert!(patch("/bin", Some(&vec![0u8, 1]), Some(&vec![2u8])).is_none());
    }

    #[test]
    fn three_way_merges_apart_and_refuses_overlaps() {
        let base = b"a\nb\nc\nd\ne\n";
        let ours = b"A\nb\nc\nd\ne\n";
        let theirs = b"a\nb\nc\nd\nE\n";
        assert_eq!(merge3(base, ours, theirs).unwrap(), b"A\nb\nc\nd\nE\n");
        let clash = b"Z\nb\nc\nd\ne\n";
        assert!(merge3(base, ours, clash).is_none());
        assert!(merge3(b"\0", b"x", b"y").is_none());
    }
}
