//! A connection to one registry repository, authenticated for pulling or
//! pushing, for callers other than the image pull (the snapshot artifacts of
//! `forkvm-artifact`). The client, the transport rules (plain HTTP for
//! loopback and `insecure_http` hosts), the credentials and the error
//! mapping are the image pull's, so both paths behave alike.

use oci_client::errors::OciDistributionError;
use oci_client::{Client, Reference, RegistryOperation};

use super::errors::{map_io, map_oci, Ctx};
use super::{make_client, parse_reference, uses_plain_http, PullError, PullOptions};
use crate::auth::RegistryAuth;

/// An authenticated client for one reference's repository.
pub struct Session {
    pub client: Client,
    pub reference: Reference,
    pub auth: oci_client::secrets::RegistryAuth,
    /// `host[:port]` of the registry.
    pub host: String,
    /// The reference, normalised.
    pub canonical: String,
    url: String,
    authed: bool,
}

impl Session {
    /// Parse `reference`, build the client and authenticate for `op` (a
    /// dead host or refused credentials fail here, before any content).
    pub async fn open(
        reference: &str,
        opts: &PullOptions,
        op: RegistryOperation,
    ) -> Result<Session, PullError> {
        let r = parse_reference(reference)?;
        let canonical = r.whole();
        let host = r.resolve_registry().to_string();
        let auth = match &opts.auth {
            RegistryAuth::Anonymous => oci_client::secrets::RegistryAuth::Anonymous,
            RegistryAuth::Basic { username, password } => {
                oci_client::secrets::RegistryAuth::Basic(username.clone(), password.clone())
            }
            RegistryAuth::IdentityToken(_) => {
                return Err(PullError::Unsupported {
                    reference: canonical,
                    what: format!(
                        "the credentials for {host} are an OAuth identity token, which forkvm \
                         cannot use; give --username/--password"
                    ),
                })
            }
        };
        let plain = uses_plain_http(&host, opts);
        let client = make_client(&host, plain, opts)?;
        let s = Session {
            client,
            url: format!("{}://{host}/v2/", if plain { "http" } else { "https" }),
            authed: !matches!(opts.auth, RegistryAuth::Anonymous),
            reference: r,
            auth,
            host,
            canonical,
        };
        s.client
            .auth(&s.reference, &s.auth, op)
            .await
            .map_err(|e| s.error(e, &format!("access to {}", s.canonical), false))?;
        Ok(s)
    }

    /// A registry error while fetching or sending `what`, as a [`PullError`]
    /// that names the host and says what to do. `blob`: `what` is a blob.
    pub fn error(&self, e: OciDistributionError, what: &str, blob: bool) -> PullError {
        map_oci(e, &self.ctx(what, blob))
    }

    /// An I/O error of a blob stream, as a [`PullError`].
    pub fn io_error(&self, e: std::io::Error, what: &str) -> PullError {
        map_io(e, &self.ctx(what, true))
    }

    fn ctx(&self, what: &str, blob: bool) -> Ctx<'_> {
        Ctx {
            host: &self.host,
            reference: &self.canonical,
            what: what.to_string(),
            authed: self.authed,
            blob,
            url: self.url.clone(),
        }
    }

    /// The reference with `digest` in place of its tag.
    pub fn at(&self, digest: &str) -> Reference {
        self.reference.clone_with_digest(digest.to_string())
    }
}
