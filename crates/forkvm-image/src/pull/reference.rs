//! Image references and how to reach their registry.
//!
//! A reference is `[HOST[:PORT]/]NAME[:TAG][@sha256:HEX]`, parsed with
//! docker's rules (oci-client's grammar, plus bracketed IPv6 hosts).

use std::net::Ipv4Addr;

use oci_client::Reference;

use super::{PullError, PullOptions};
use crate::blobs::digest_hex;

/// Parse a reference, as docker does: no host means Docker Hub
/// (`busybox` = `docker.io/library/busybox:latest`), no tag or digest means
/// `:latest`. Besides oci-client's grammar, a bracketed IPv6 host
/// (`[::1]:5000/app`) is accepted. Only sha256 digests are.
pub fn parse_reference(s: &str) -> Result<Reference, PullError> {
    let bad = |reason: &str| PullError::BadReference {
        reference: s.to_string(),
        reason: reason.to_string(),
    };
    let r = if let Some(after) = s.strip_prefix('[') {
        // `[v6addr]:port/rest`: parse the rest under a stand-in host, then
        // put the real one back.
        let (addr, tail) = after.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
        let (port, rest) = tail
            .split_once('/')
            .ok_or_else(|| bad("no repository after the host"))?;
        let port_ok = port.is_empty()
            || port
                .strip_prefix(':')
                .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if addr.parse::<std::net::Ipv6Addr>().is_err() || !port_ok {
            return Err(bad("bad IPv6 host"));
        }
        let host = format!("[{addr}]{port}");
        let tmp: Reference = format!("stand-in.invalid/{rest}")
            .parse()
            .map_err(|e: oci_client::ParseError| bad(&explain(e)))?;
        let repo = tmp.repository().to_string();
        match (tmp.tag(), tmp.digest()) {
            (Some(t), Some(d)) => {
                Reference::with_tag_and_digest(host, repo, t.to_string(), d.to_string())
            }
            (None, Some(d)) => Reference::with_digest(host, repo, d.to_string()),
            (t, None) => Reference::with_tag(host, repo, t.unwrap_or("latest").to_string()),
        }
    } else {
        s.parse()
            .map_err(|e: oci_client::ParseError| bad(&explain(e)))?
    };
    if let Some(d) = r.digest() {
        if !d.starts_with("sha256:") {
            return Err(bad("only sha256 digests are supported"));
        }
        digest_hex(d).map_err(|_| bad("the digest must be 64 lowercase hex digits"))?;
    }
    Ok(r)
}

/// oci-spec's "invalid reference format" says nothing of the usual causes.
fn explain(e: oci_client::ParseError) -> String {
    match e {
        oci_client::ParseError::ReferenceInvalidFormat => "invalid reference format: names are \
            lowercase letters, digits and '.', '_', '-' separators; tags are up to 128 letters, \
            digits, '.', '_', '-'"
            .into(),
        e => e.to_string(),
    }
}

/// Whether a registry host (`host[:port]`) is this machine.
pub fn is_loopback(registry: &str) -> bool {
    let host = match registry.strip_prefix('[') {
        Some(rest) => return rest.split(']').next() == Some("::1"),
        None => registry.split(':').next().unwrap_or(registry),
    };
    host == "localhost" || host.parse::<Ipv4Addr>().is_ok_and(|a| a.is_loopback())
}

/// Whether `registry` is spoken to over plain http (see the module doc).
pub fn uses_plain_http(registry: &str, opts: &PullOptions) -> bool {
    let host_only = match registry.rfind(':') {
        Some(i) if !registry.ends_with(']') => &registry[..i],
        _ => registry,
    };
    opts.insecure_http
        .iter()
        .any(|h| h == registry || h == host_only)
        || (opts.loopback_plain_http && is_loopback(registry))
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn parts(s: &str) -> (String, String, Option<String>, Option<String>) {
        let r = parse_reference(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        (
            r.registry().to_string(),
            r.repository().to_string(),
            r.tag().map(str::to_string),
            r.digest().map(str::to_string),
        )
    }

    #[test]
    fn references() {
        let s = |x: &str| x.to_string();
        let hub = s("docker.io");
        assert_eq!(
            parts("busybox"),
            (hub.clone(), s("library/busybox"), Some(s("latest")), None)
        );
        assert_eq!(
            parts("me/app:1.0"),
            (hub.clone(), s("me/app"), Some(s("1.0")), None)
        );
        assert_eq!(parts("index.docker.io/library/debian:12").0, hub);
        assert_eq!(
            parts("127.0.0.1:5000/a/b:v1"),
            (s("127.0.0.1:5000"), s("a/b"), Some(s("v1")), None)
        );
        assert_eq!(parts("localhost/app").0, "localhost");
        // A digest alone: no tag is made up; with both, both are kept.
        assert_eq!(parts(&format!("r.example/app@{D}")).2, None);
        let (_, _, t, d) = parts(&format!("r.example/app:v2@{D}"));
        assert_eq!((t.as_deref(), d.as_deref()), (Some("v2"), Some(D)));
        // IPv6 hosts, with and without a port, tag or digest.
        assert_eq!(
            parts("[::1]:5000/app:v3"),
            (s("[::1]:5000"), s("app"), Some(s("v3")), None)
        );
        assert_eq!(parts("[::1]/ns/app").2.as_deref(), Some("latest"));
        assert_eq!(parts(&format!("[::1]:5000/app@{D}")).3.as_deref(), Some(D));
        assert_eq!(
            parse_reference("[::1]:5000/app:v3").unwrap().whole(),
            "[::1]:5000/app:v3"
        );
    }

    #[test]
    fn bad_references() {
        for (s, why) in [
            ("", "component"),
            ("Upper/Case", "format"),
            ("app:bad tag", "format"),
            (&*format!("app@sha256:{}", "a".repeat(40)), "length"),
            (&*format!("app@sha512:{}", "a".repeat(128)), "sha256"),
            (
                &*format!("app@{}", D.to_uppercase().replace("SHA256", "sha256")),
                "lowercase",
            ),
            ("[::1:5000/app", "unclosed"),
            ("[::1]", "no repository"),
            ("[zz]:5000/app", "IPv6"),
            ("[::1]:50x/app", "IPv6"),
        ] {
            let e = parse_reference(s).unwrap_err().to_string();
            eprintln!("{e}");
            assert!(e.to_lowercase().contains(&why.to_lowercase()), "{s:?}: {e}");
            assert!(e.contains("expected [HOST"), "{e}");
        }
    }

    #[test]
    fn transport_choice() {
        for h in [
            "localhost",
            "localhost:5000",
            "127.0.0.1:5000",
            "127.1.2.3",
            "[::1]:5000",
            "[::1]",
        ] {
            assert!(is_loopback(h), "{h}");
        }
        for h in [
            "r.example",
            "10.0.0.1:5000",
            "[::2]:5000",
            "localhost.example",
        ] {
            assert!(!is_loopback(h), "{h}");
        }
        let mut o = PullOptions::default();
        assert!(uses_plain_http("127.0.0.1:5000", &o));
        assert!(!uses_plain_http("r.example:5000", &o));
        o.loopback_plain_http = false;
        assert!(!uses_plain_http("127.0.0.1:5000", &o));
        o.insecure_http = vec!["r.example".into(), "q.example:5000".into()];
        assert!(uses_plain_http("r.example:443", &o));
        assert!(uses_plain_http("r.example", &o));
        assert!(uses_plain_http("q.example:5000", &o));
        assert!(!uses_plain_http("q.example:5001", &o));
        assert_eq!(o.platform, ("linux".to_string(), "amd64".to_string()));
    }
}
