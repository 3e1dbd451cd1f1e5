//! Registry credentials: explicit flags, else the Docker CLI's config file,
//! else anonymous.
//!
//! The Docker config file (`$DOCKER_CONFIG/config.json`, by default
//! `~/.docker/config.json`) is JSON. Only its `auths` map is read:
//!
//! ```text
//! { "auths": {
//!     "registry.example.com":        { "auth": "<base64 of user:password>" },
//!     "https://index.docker.io/v1/": { "username": "u", "password": "p" },
//!     "http://127.0.0.1:5000":       { "identitytoken": "<oauth refresh token>" } },
//!   "credsStore": "...", "credHelpers": { ... } }
//! ```
//!
//! Keys are what `docker login` was given, so the same registry may appear
//! as `host`, `https://host`, `http://host` or `https://host/v1/`: a key
//! matches when it names the same host (and port) once the scheme and any
//! path are stripped; an exact key wins over such a normalised match. Docker
//! Hub is stored under `https://index.docker.io/v1/` and is looked up under
//! that name whether the reference said `docker.io` or `index.docker.io`.
//!
//! Credential helpers (`credsStore`, `credHelpers`) are programs forkvm does
//! not run: an entry that only names a helper gives anonymous access.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

use crate::pull::PullError;

/// How to authenticate to a registry.
#[derive(Clone, PartialEq, Eq, Default)]
pub enum RegistryAuth {
    /// No credentials (public images; a registry's bearer-token challenge is
    /// still answered, anonymously).
    #[default]
    Anonymous,
    /// A user name and password (or access token used as a password): sent
    /// with HTTP basic auth, or to the registry's token service.
    Basic { username: String, password: String },
    /// An OAuth refresh token stored by `docker login` for registries with an
    /// OAuth flow. Recognised so the error can say so; pulls refuse it.
    IdentityToken(String),
}

// Never print secrets (errors and logs may show the options).
impl fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegistryAuth::Anonymous => f.write_str("Anonymous"),
            RegistryAuth::Basic { username, .. } => f
                .debug_struct("Basic")
                .field("username", username)
                .field("password", &"<redacted>")
                .finish(),
            RegistryAuth::IdentityToken(_) => f.write_str("IdentityToken(<redacted>)"),
        }
    }
}

/// Where the Docker CLI keeps its config: `$DOCKER_CONFIG/config.json`, else
/// `$HOME/.docker/config.json` (whether or not the file exists).
pub fn default_docker_config() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d).join("config.json"));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".docker").join("config.json"))
}

/// The credentials to use for `registry_host` (as in a reference:
/// `host[:port]`). `explicit` (user, password) wins. Else `docker_config`
/// names a config file to read (it must exist), or with `None` the default
/// one is read if present ([`default_docker_config`]). Else anonymous.
pub fn credentials_for(
    registry_host: &str,
    explicit: Option<(String, String)>,
    docker_config: Option<&Path>,
) -> Result<RegistryAuth, PullError> {
    if let Some((username, password)) = explicit {
        return Ok(RegistryAuth::Basic { username, password });
    }
    let path = match docker_config {
        Some(p) => p.to_path_buf(),
        None => match default_docker_config() {
            Some(p) if p.exists() => p,
            _ => return Ok(RegistryAuth::Anonymous),
        },
    };
    let text = std::fs::read(&path).map_err(|e| PullError::DockerConfig {
        path: path.clone(),
        reason: format!("cannot read it: {e}"),
    })?;
    from_config_json(registry_host, &text)
        .map_err(|reason| PullError::DockerConfig { path, reason })
}

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

#[derive(Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
}

/// Docker Hub's many names all mean the key `docker login` writes for it.
fn canonical_host(host: &str) -> &str {
    match host {
        "docker.io" | "index.docker.io" | "registry-1.docker.io" => "index.docker.io",
        h => h,
    }
}

/// The `host[:port]` an `auths` key names: scheme and path stripped.
fn key_host(key: &str) -> &str {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    k.split('/').next().unwrap_or(k)
}

/// Look `registry_host` up in a config file's text; `Err` is the reason the
/// file is unusable (the caller names the file).
fn from_config_json(registry_host: &str, text: &[u8]) -> Result<RegistryAuth, String> {
    let cfg: ConfigFile =
        serde_json::from_slice(text).map_err(|e| format!("it is not valid JSON: {e}"))?;
    let want = canonical_host(registry_host);
    let entry = cfg.auths.get_key_value(registry_host).or_else(|| {
        cfg.auths
            .iter()
            .find(|(k, _)| canonical_host(key_host(k)) == want)
    });
    let Some((key, e)) = entry else {
        return Ok(RegistryAuth::Anonymous);
    };
    if let Some(tok) = e.identitytoken.as_deref().filter(|t| !t.is_empty()) {
        return Ok(RegistryAuth::IdentityToken(tok.to_string()));
    }
    if let Some(a) = e.auth.as_deref().filter(|a| !a.is_empty()) {
        // Docker writes padded standard base64; accept it unpadded too.
        let raw = base64::engine::general_purpose::STANDARD
            .decode(a.trim())
            .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(a.trim()))
            .map_err(|_| format!("auths[{key:?}].auth is not base64"))?;
        let s = String::from_utf8(raw)
            .map_err(|_| format!("auths[{key:?}].auth does not decode to UTF-8 text"))?;
        let (u, p) = s
            .split_once(':')
            .ok_or_else(|| format!("auths[{key:?}].auth does not decode to user:password"))?;
        return Ok(RegistryAuth::Basic {
            username: u.to_string(),
            password: p.to_string(),
        });
    }
    match (e.username.as_deref(), e.password.as_deref()) {
        (Some(u), Some(p)) if !u.is_empty() => Ok(RegistryAuth::Basic {
            username: u.to_string(),
            password: p.to_string(),
        }),
        // `{}`: docker login stored the secret in a credential helper.
        (None, None) => Ok(RegistryAuth::Anonymous),
        _ => Err(format!(
            "auths[{key:?}] has a username without a password (or the reverse)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn basic(u: &str, p: &str) -> RegistryAuth {
        RegistryAuth::Basic {
            username: u.into(),
            password: p.into(),
        }
    }

    fn lookup(host: &str, json: &str) -> Result<RegistryAuth, String> {
        from_config_json(host, json.as_bytes())
    }

    #[test]
    fn auth_field_and_key_shapes() {
        let a = b64("alice:s3cr:et");
        for key in [
            "127.0.0.1:5000",
            "https://127.0.0.1:5000",
            "http://127.0.0.1:5000",
            "https://127.0.0.1:5000/v1/",
            "127.0.0.1:5000/v2/",
        ] {
            let j = format!(r#"{{"auths":{{"{key}":{{"auth":"{a}"}}}}}}"#);
            // The password keeps its own colons: split at the first one.
            assert_eq!(
                lookup("127.0.0.1:5000", &j),
                Ok(basic("alice", "s3cr:et")),
                "{key}"
            );
            // Another port is another registry.
            assert_eq!(lookup("127.0.0.1:5001", &j), Ok(RegistryAuth::Anonymous));
        }
        // Unpadded base64 is accepted too.
        let unpadded = a.trim_end_matches('=');
        let j = format!(r#"{{"auths":{{"r.example":{{"auth":"{unpadded}"}}}}}}"#);
        assert_eq!(lookup("r.example", &j), Ok(basic("alice", "s3cr:et")));
    }

    #[test]
    fn exact_key_wins_over_normalised_one() {
        let j = format!(
            r#"{{"auths":{{"https://r.example/v1/":{{"auth":"{}"}},"r.example":{{"auth":"{}"}}}}}}"#,
            b64("old:1"),
            b64("new:2")
        );
        assert_eq!(lookup("r.example", &j), Ok(basic("new", "2")));
    }

    #[test]
    fn username_password_and_identity_token() {
        let j = r#"{"auths":{"r.example":{"username":"bob","password":"pw"}}}"#;
        assert_eq!(lookup("r.example", j), Ok(basic("bob", "pw")));
        let j = r#"{"auths":{"r.example":{"identitytoken":"tok"}}}"#;
        assert_eq!(
            lookup("r.example", j),
            Ok(RegistryAuth::IdentityToken("tok".into()))
        );
    }

    #[test]
    fn docker_hub_names() {
        let j = format!(
            r#"{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{}"}}}}}}"#,
            b64("hub:pw")
        );
        for h in ["docker.io", "index.docker.io", "registry-1.docker.io"] {
            assert_eq!(lookup(h, &j), Ok(basic("hub", "pw")), "{h}");
        }
    }

    #[test]
    fn helper_only_or_missing_entries_are_anonymous() {
        let j = r#"{"auths":{"r.example":{}},"credsStore":"desktop"}"#;
        assert_eq!(lookup("r.example", j), Ok(RegistryAuth::Anonymous));
        assert_eq!(lookup("other.example", j), Ok(RegistryAuth::Anonymous));
        assert_eq!(lookup("r.example", "{}"), Ok(RegistryAuth::Anonymous));
    }

    #[test]
    fn corrupt_entries_are_refused() {
        for (j, want) in [
            (r#"{"auths":{"r.example":{"auth":"!!!"}}}"#, "not base64"),
            (
                &*format!(
                    r#"{{"auths":{{"r.example":{{"auth":"{}"}}}}}}"#,
                    b64("nocolon")
                ),
                "user:password",
            ),
            (
                r#"{"auths":{"r.example":{"username":"bob"}}}"#,
                "without a password",
            ),
            (r#"{"auths":{"r.example":{"auth":7}}}"#, "not valid JSON"),
            (r#"{"auths":["#, "not valid JSON"),
            ("", "not valid JSON"),
        ] {
            let e = lookup("r.example", j).unwrap_err();
            assert!(e.contains(want), "{j}: {e}");
        }
    }

    #[test]
    fn files_explicit_default_and_corrupt() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("config.json");
        // Explicit flags win without reading anything.
        let got = credentials_for("r.example", Some(("u".into(), "p".into())), Some(&p));
        assert_eq!(got.unwrap(), basic("u", "p"));
        // A named file that is missing is an error naming it.
        let e = credentials_for("r.example", None, Some(&p)).unwrap_err();
        assert!(e.to_string().contains(&*p.to_string_lossy()), "{e}");
        std::fs::write(
            &p,
            format!(r#"{{"auths":{{"r.example":{{"auth":"{}"}}}}}}"#, b64("u:p")),
        )
        .unwrap();
        assert_eq!(
            credentials_for("r.example", None, Some(&p)).unwrap(),
            basic("u", "p")
        );
        std::fs::write(&p, b"{\"auths\": {").unwrap();
        let e = credentials_for("r.example", None, Some(&p)).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(&*p.to_string_lossy()) && msg.contains("JSON"),
            "{msg}"
        );
    }

    #[test]
    fn debug_hides_secrets() {
        let s = format!("{:?}", basic("u", "hunter2"));
        assert!(!s.contains("hunter2"), "{s}");
        let s = format!("{:?}", RegistryAuth::IdentityToken("tok123".into()));
        assert!(!s.contains("tok123"), "{s}");
    }
}
