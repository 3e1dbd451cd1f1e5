//! The dashboard's session cookie, shared by the daemon and the cluster
//! gateway: a browser cannot send a bearer token from a page it loads by
//! URL, so `/ui/login` takes the token once and sets this cookie instead.
//! It holds a digest of the token, not the token, so a stolen cookie is no
//! bearer token for other clients; it stays valid while the token does.

use axum::http::{header, HeaderMap};
use sha2::{Digest, Sha256};

/// The session cookie's name.
pub const COOKIE: &str = "forkvm_session";

/// What the cookie holds for a token.
pub fn session_value(token: &str) -> String {
    let d = Sha256::digest(format!("forkvm-ui-session\0{token}").as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `Set-Cookie` value that logs a browser in with `token`.
pub fn login_cookie(token: &str) -> String {
    format!(
        "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict",
        session_value(token)
    )
}

/// The `Set-Cookie` value that logs a browser out.
pub const LOGOUT_COOKIE: &str = "forkvm_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0";

/// Whether the request carries the session cookie for `token`.
pub fn has_session(headers: &HeaderMap, token: &str) -> bool {
    let want = session_value(token);
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .any(|(k, v)| k == COOKIE && crate::constant_time_eq(v.as_bytes(), want.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn the_session_cookie_is_checked_and_is_not_the_token() {
        let v = session_value("s3cret");
        assert_ne!(v, "s3cret");
        assert_eq!(v.len(), 64);
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("a=b; {COOKIE}={v}; c=d")).unwrap(),
        );
        assert!(has_session(&h, "s3cret"));
        assert!(!has_session(&h, "other"));
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("forkvm_session=s3cret"),
        );
        assert!(!has_session(&h, "s3cret"), "the raw token is no session");
        assert!(!has_session(&HeaderMap::new(), "s3cret"));
        assert!(login_cookie("s3cret").contains(&v));
    }
}
