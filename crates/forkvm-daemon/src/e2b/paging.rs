//! Page tokens of E2B's paged lists (`GET /v2/sandboxes`, `GET /snapshots`):
//! the position after the last item of a page, as its sort key (a time and
//! an id), so items created or removed between pages neither repeat nor push
//! others off a page. The SDK hands the `x-next-token` header back as
//! `nextToken` without reading it.

use base64::Engine;

/// The token of the position after `(time, id)`.
pub(crate) fn encode_token(time: &str, id: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{time}\n{id}"))
}

/// The position a token names, or `None` for one this server did not give.
pub(crate) fn decode_token(t: &str) -> Option<(String, String)> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(t)
        .ok()?;
    let s = String::from_utf8(raw).ok()?;
    let (a, b) = s.split_once('\n')?;
    Some((a.to_string(), b.to_string()))
}

/// The most items one page holds, and what a request without `limit` gets.
pub(crate) const MAX_PAGE: usize = 100;

/// A list's `limit` query parameter: 1 to [`MAX_PAGE`], default
/// [`MAX_PAGE`]; anything else is the message of a 400.
pub(crate) fn page_limit(q: &std::collections::BTreeMap<String, String>) -> Result<usize, String> {
    match q.get("limit").map(|l| l.parse::<usize>()) {
        None => Ok(MAX_PAGE),
        Some(Ok(n)) if (1..=MAX_PAGE).contains(&n) => Ok(n),
        Some(_) => Err(format!("limit must be a number from 1 to {MAX_PAGE}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_reject_garbage() {
        let t = encode_token("2026-11-25T00:00:00.000Z", "sb-1");
        assert_eq!(
            decode_token(&t),
            Some(("2026-11-25T00:00:00.000Z".into(), "sb-1".into()))
        );
        assert_eq!(decode_token("!!!"), None);
        assert_eq!(decode_token(&encode_token("x", "y").replace('e', "")), None);
    }
}
