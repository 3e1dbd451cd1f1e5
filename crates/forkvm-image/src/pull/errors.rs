//! Pull errors: what went wrong, and what the user can do about it.
//!
//! oci-client reports registry failures by transport (HTTP status, OCI
//! error envelope, reqwest error); [`map_oci`] turns them into
//! [`PullError`]s that name the host and the thing being fetched.

use std::path::PathBuf;

use oci_client::errors::{DigestError, OciDistributionError, OciErrorCode};

use crate::blobs::BlobError;

/// A pull failure, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("{reference:?} is not an image reference ({reason}); expected [HOST[:PORT]/]NAME[:TAG][@sha256:HEX]")]
    BadReference { reference: String, reason: String },
    #[error("authentication to {host} failed: check the user name and password (--username/--password or ~/.docker/config.json)")]
    Auth { host: String },
    #[error("{host} refused anonymous access to {reference}: the repository is private or does not exist; give credentials with --username/--password or in ~/.docker/config.json")]
    AuthRequired { host: String, reference: String },
    #[error("{what} not found on {host}: {hint}")]
    NotFound {
        host: String,
        what: String,
        hint: String,
    },
    #[error("{what} from {host} failed verification: expected {expected}, got {actual}; the registry's copy is corrupt or was tampered with (it was not stored)")]
    DigestMismatch {
        host: String,
        what: String,
        expected: String,
        actual: String,
    },
    #[error("cannot reach registry {host} ({url}): {cause}; check the address and that the registry is up")]
    Unreachable {
        host: String,
        url: String,
        cause: String,
    },
    #[error("TLS with registry {host} failed: {cause}; for a private CA give it with --ca-cert FILE, for a plain-http registry use --insecure-registry {host}")]
    Tls { host: String, cause: String },
    #[error("transfer from {host} failed: {cause}; pull again (blobs already fetched are kept)")]
    Network { host: String, cause: String },
    #[error("{reference} has no image for {want}; it has: {}", available.join(", "))]
    NoPlatform {
        reference: String,
        want: String,
        available: Vec<String>,
    },
    #[error("{reference}: {what}")]
    Unsupported { reference: String, what: String },
    #[error("registry {host} answered with an error: {message}")]
    Registry { host: String, message: String },
    #[error("docker config {}: {reason}; fix the file, or give --username/--password", path.display())]
    DockerConfig { path: PathBuf, reason: String },
    #[error("CA certificate {what}: {reason}")]
    CaCert { what: String, reason: String },
    #[error("blob store: {0}")]
    Store(#[from] BlobError),
}

/// What error mapping needs to know about the request that failed.
pub(crate) struct Ctx<'a> {
    pub host: &'a str,
    pub reference: &'a str,
    /// "manifest of REF", "layer sha256:…": the thing being fetched.
    pub what: String,
    pub authed: bool,
    /// A blob (config, layer), not a manifest.
    pub blob: bool,
    pub url: String,
}

pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = c.source();
    }
    s
}

fn denied(c: &Ctx) -> PullError {
    if c.authed {
        PullError::Auth {
            host: c.host.to_string(),
        }
    } else {
        PullError::AuthRequired {
            host: c.host.to_string(),
            reference: c.reference.to_string(),
        }
    }
}

/// A 404 for what `c` fetched. The registry does not say whether the
/// repository or the tag is missing (distribution answers MANIFEST_UNKNOWN
/// for both), so the hint names both.
fn not_found(c: &Ctx) -> PullError {
    PullError::NotFound {
        host: c.host.to_string(),
        what: c.what.clone(),
        hint: if c.blob {
            "the registry lacks data its manifest names; push the image to it again".into()
        } else {
            "check the repository name and the tag or digest".into()
        },
    }
}

pub(crate) fn map_io(e: std::io::Error, c: &Ctx) -> PullError {
    if let Some(DigestError::VerificationError { expected, actual }) =
        e.get_ref().and_then(|i| i.downcast_ref::<DigestError>())
    {
        return PullError::DigestMismatch {
            host: c.host.to_string(),
            what: c.what.clone(),
            expected: expected.clone(),
            actual: actual.clone(),
        };
    }
    PullError::Network {
        host: c.host.to_string(),
        cause: chain(&e),
    }
}

pub(crate) fn map_oci(e: OciDistributionError, c: &Ctx) -> PullError {
    use OciDistributionError as E;
    let host = c.host.to_string();
    match e {
        E::UnauthorizedError { .. } | E::AuthenticationFailure(_) => denied(c),
        E::RegistryError { envelope, .. } => {
            let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|x| &x.code).collect();
            let has = |k: OciErrorCode| codes.iter().any(|c| **c == k);
            if has(OciErrorCode::Unauthorized) || has(OciErrorCode::Denied) {
                denied(c)
            } else if has(OciErrorCode::NameUnknown) {
                PullError::NotFound {
                    host,
                    what: format!("the repository of {}", c.reference),
                    hint: "check the repository name".into(),
                }
            } else if has(OciErrorCode::ManifestUnknown)
                || has(OciErrorCode::NotFound)
                || has(OciErrorCode::BlobUnknown)
            {
                not_found(c)
            } else {
                let msgs: Vec<String> = envelope
                    .errors
                    .iter()
                    .map(|x| format!("{:?}: {}", x.code, x.message))
                    .collect();
                PullError::Registry {
                    host,
                    message: msgs.join("; "),
                }
            }
        }
        E::ServerError { code, message, .. } => match code {
            401 | 403 => denied(c),
            404 => not_found(c),
            _ => PullError::Registry {
                host,
                message: format!(
                    "HTTP {code}: {}",
                    message.chars().take(300).collect::<String>()
                ),
            },
        },
        E::DigestError(DigestError::VerificationError { expected, actual }) => {
            PullError::DigestMismatch {
                host,
                what: c.what.clone(),
                expected,
                actual,
            }
        }
        E::IoError(io) => map_io(io, c),
        E::RequestError(r) => {
            let cause = chain(&r);
            let low = cause.to_ascii_lowercase();
            if low.contains("certificate") || low.contains("tls") || low.contains("handshake") {
                PullError::Tls { host, cause }
            } else if r.is_connect() || r.is_timeout() {
                PullError::Unreachable {
                    host,
                    url: c.url.clone(),
                    cause,
                }
            } else {
                PullError::Network { host, cause }
            }
        }
        other => PullError::Registry {
            host,
            message: chain(&other),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_client::errors::{OciEnvelope, OciError};

    fn ctx(authed: bool) -> Ctx<'static> {
        Ctx {
            host: "r.example",
            reference: "r.example/app:v1",
            what: "manifest of r.example/app:v1".into(),
            authed,
            blob: false,
            url: "https://r.example/v2/".into(),
        }
    }

    fn envelope(code: OciErrorCode) -> OciDistributionError {
        OciDistributionError::RegistryError {
            envelope: OciEnvelope {
                errors: vec![OciError {
                    code,
                    message: "m".into(),
                    detail: serde_json::Value::Null,
                }],
            },
            url: "u".into(),
        }
    }

    #[test]
    fn error_mapping() {
        let unauth = || OciDistributionError::UnauthorizedError { url: "u".into() };
        let e = map_oci(unauth(), &ctx(true));
        assert_eq!(
            e.to_string(),
            "authentication to r.example failed: check the user name and password \
             (--username/--password or ~/.docker/config.json)"
        );
        assert!(matches!(
            map_oci(unauth(), &ctx(false)),
            PullError::AuthRequired { .. }
        ));
        assert!(matches!(
            map_oci(envelope(OciErrorCode::Denied), &ctx(true)),
            PullError::Auth { .. }
        ));
        let e = map_oci(envelope(OciErrorCode::ManifestUnknown), &ctx(false));
        assert_eq!(
            e.to_string(),
            "manifest of r.example/app:v1 not found on r.example: \
             check the repository name and the tag or digest"
        );
        let e = map_oci(envelope(OciErrorCode::NameUnknown), &ctx(false));
        assert_eq!(
            e.to_string(),
            "the repository of r.example/app:v1 not found on r.example: check the repository name"
        );
        let blob = Ctx {
            blob: true,
            ..ctx(false)
        };
        let e = map_oci(envelope(OciErrorCode::BlobUnknown), &blob);
        assert!(e.to_string().contains("lacks data"), "{e}");
        let e = map_oci(envelope(OciErrorCode::Toomanyrequests), &ctx(false));
        assert!(e.to_string().contains("Toomanyrequests: m"), "{e}");
        let server = |code| OciDistributionError::ServerError {
            code,
            url: "u".into(),
            message: "boom".into(),
        };
        assert!(matches!(
            map_oci(server(404), &ctx(false)),
            PullError::NotFound { .. }
        ));
        assert!(matches!(
            map_oci(server(403), &ctx(true)),
            PullError::Auth { .. }
        ));
        assert!(map_oci(server(500), &ctx(false))
            .to_string()
            .contains("HTTP 500: boom"));
        let bad = || DigestError::VerificationError {
            expected: "sha256:e".into(),
            actual: "sha256:a".into(),
        };
        let e = map_oci(OciDistributionError::DigestError(bad()), &ctx(false));
        assert!(matches!(e, PullError::DigestMismatch { .. }), "{e}");
        assert!(
            e.to_string().contains("expected sha256:e, got sha256:a"),
            "{e}"
        );
        // The streaming path wraps the same error in an io::Error.
        let io = std::io::Error::other(bad());
        let e = map_oci(OciDistributionError::IoError(io), &ctx(false));
        assert!(matches!(e, PullError::DigestMismatch { .. }), "{e}");
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let e = map_oci(OciDistributionError::IoError(io), &ctx(false));
        assert!(e.to_string().contains("pull again"), "{e}");
    }
}
