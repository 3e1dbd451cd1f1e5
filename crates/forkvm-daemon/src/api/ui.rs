//! The dashboard at `/ui`: its built files (`ui/` in the repository, built
//! and installed by `scripts/setup.sh`, see `Config::ui_dir`), and its login.
//!
//! On TCP every request needs the bearer token. A browser cannot send one
//! from a page it loads by URL, so `/ui/login` takes the token once in a
//! form and sets a session cookie in exchange: `HttpOnly` (no script reads
//! it) and `SameSite=Strict` (no other site's page sends it, which is what
//! keeps cross-site requests from acting with it). The cookie is not the
//! token but a digest of it, so a stolen cookie is no bearer token for other
//! clients; it stays valid while the daemon's token does. On the unix socket
//! there is no auth, and `forkvm ui` relays a local browser to it.
//!
//! Every page is served with a Content-Security-Policy that allows nothing
//! but this origin, so the dashboard can make no request elsewhere.

use std::path::{Component, Path, PathBuf};

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};

use super::{constant_time_eq, AppState};

pub use forkvm_listen::session::{has_session, session_value, COOKIE};

/// Paths that answer without auth: the login itself.
pub fn is_public(path: &str) -> bool {
    path == "/ui/login" || path == "/ui/logout"
}

/// Whether a path belongs to the dashboard (a browser is sent to the login
/// page rather than given a 401).
pub fn is_ui(path: &str) -> bool {
    path == "/ui" || path.starts_with("/ui/")
}

/// The dashboard's routes. `token` is the TCP listener's (None on the unix
/// socket, where the login page just leads on).
pub fn routes(token: Option<String>) -> Router<AppState> {
    let t = token.clone();
    Router::new()
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/", get(serve))
        .route("/ui/{*path}", get(serve))
        .route(
            "/ui/login",
            get(move || {
                let open = token.is_none();
                async move {
                    if open {
                        Redirect::to("/ui/").into_response()
                    } else {
                        login_page(StatusCode::OK, "").into_response()
                    }
                }
            })
            .post(move |form: Form<Login>| {
                let t = t.clone();
                async move { login(t.as_deref(), &form.token) }
            }),
        )
        .route("/ui/logout", post(logout))
}

#[derive(serde::Deserialize)]
pub struct Login {
    #[serde(default)]
    token: String,
}

fn login(token: Option<&str>, given: &str) -> Response {
    let Some(token) = token else {
        return Redirect::to("/ui/").into_response();
    };
    if !constant_time_eq(given.trim().as_bytes(), token.as_bytes()) {
        return login_page(
            StatusCode::UNAUTHORIZED,
            "Wrong token. Use the token the daemon was started with (FORKVM_TOKEN).",
        )
        .into_response();
    }
    let mut r = Redirect::to("/ui/").into_response();
    *r.status_mut() = StatusCode::SEE_OTHER;
    if let Ok(v) = HeaderValue::from_str(&forkvm_listen::session::login_cookie(token)) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

async fn logout() -> Response {
    let mut r = Redirect::to("/ui/login").into_response();
    *r.status_mut() = StatusCode::SEE_OTHER;
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(forkvm_listen::session::LOGOUT_COOKIE),
    );
    r
}

/// Send a browser without a session to the login page.
pub fn to_login() -> Response {
    let mut r = Redirect::to("/ui/login").into_response();
    *r.status_mut() = StatusCode::SEE_OTHER;
    r
}

const CSP: &str = "default-src 'self'; connect-src 'self'; img-src 'self' data:; \
     style-src 'self' 'unsafe-inline'; script-src 'self'; worker-src 'self' blob:; \
     font-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

fn secure(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

fn login_page(status: StatusCode, error: &str) -> Response {
    let err = if error.is_empty() {
        String::new()
    } else {
        format!("<p class=\"error\" role=\"alert\">{error}</p>")
    };
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<title>forkvm: sign in</title><link rel=\"icon\" href=\"data:,\"><style>\
body{{font-family:system-ui,sans-serif;background:#0f1720;color:#e6edf3;display:grid;place-items:center;min-height:100vh;margin:0}}\
main{{background:#17212b;padding:2rem;border-radius:8px;min-width:20rem}}\
label{{display:block;margin:.5rem 0}}input{{width:100%;padding:.5rem;box-sizing:border-box}}\
button{{margin-top:1rem;padding:.5rem 1rem}}.error{{color:#ff9b9b}}</style></head>\
<body><main><h1>forkvm</h1>{err}<form method=\"post\" action=\"/ui/login\">\
<label for=\"token\">Daemon token</label>\
<input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"current-password\" required autofocus>\
<button type=\"submit\">Sign in</button></form></main></body></html>"
    );
    secure(
        (
            status,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            html,
        )
            .into_response(),
    )
}

/// A file of the built dashboard; paths without an extension get
/// `index.html` (the app routes in the page).
async fn serve(State(m): State<AppState>, req: Request) -> Response {
    let dir = m.ui_dir();
    let rel = req
        .uri()
        .path()
        .trim_start_matches("/ui")
        .trim_start_matches('/');
    let Some(path) = resolve(&dir, rel) else {
        return secure((StatusCode::NOT_FOUND, "no such file").into_response());
    };
    match tokio::fs::read(&path).await {
        Ok(body) => {
            let immutable = rel.starts_with("assets/");
            secure(
                (
                    [
                        (header::CONTENT_TYPE, content_type(&path)),
                        (
                            header::CACHE_CONTROL,
                            if immutable {
                                "public, max-age=31536000, immutable"
                            } else {
                                "no-cache"
                            },
                        ),
                    ],
                    body,
                )
                    .into_response(),
            )
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if path.ends_with("index.html") {
                secure(
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "the dashboard is not installed in {}; run scripts/setup.sh \
                             (or set FORKVM_UI_DIR to a built ui/dist)",
                            dir.display()
                        ),
                    )
                        .into_response(),
                )
            } else {
                secure((StatusCode::NOT_FOUND, "no such file").into_response())
            }
        }
        Err(e) => {
            tracing::warn!("dashboard: cannot read {}: {e}", path.display());
            secure(
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("cannot read {}: {e}", path.display()),
                )
                    .into_response(),
            )
        }
    }
}

/// The file for a request path under `dir`: only plain components (no
/// `..`, no absolute paths), and `index.html` for the app's own routes.
fn resolve(dir: &Path, rel: &str) -> Option<PathBuf> {
    let rel = rel.split(['?', '#']).next().unwrap_or("");
    let p = Path::new(rel);
    if !p.components().all(|c| matches!(c, Component::Normal(_))) {
        return None;
    }
    let has_ext = p.extension().is_some();
    if rel.is_empty() || !has_ext {
        return Some(dir.join("index.html"));
    }
    Some(dir.join(p))
}

fn content_type(p: &Path) -> &'static str {
    match p.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" | "map" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "woff" => "font/woff",
        "wasm" => "application/wasm",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_paths_resolve() {
        let d = Path::new("/srv/ui");
        assert_eq!(resolve(d, ""), Some(d.join("index.html")));
        assert_eq!(resolve(d, "sandbox/sb-1"), Some(d.join("index.html")));
        assert_eq!(
            resolve(d, "assets/app-1a2b.js"),
            Some(d.join("assets/app-1a2b.js"))
        );
        assert_eq!(resolve(d, "../state.db"), None);
        assert_eq!(resolve(d, "assets/../../x.js"), None);
        assert_eq!(resolve(d, "/etc/passwd"), None);
    }

    #[test]
    fn a_wrong_token_is_refused_and_a_right_one_sets_the_cookie() {
        let r = login(Some("right"), "wrong");
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert!(r.headers().get(header::SET_COOKIE).is_none());
        let r = login(Some("right"), "right");
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
        let c = r.headers()[header::SET_COOKIE].to_str().unwrap();
        assert!(
            c.contains("HttpOnly") && c.contains("SameSite=Strict"),
            "{c}"
        );
        assert!(c.contains(&session_value("right")));
        assert!(r.headers().get(header::CONTENT_SECURITY_POLICY).is_none());
        assert!(login_page(StatusCode::OK, "")
            .headers()
            .contains_key(header::CONTENT_SECURITY_POLICY));
    }
}
