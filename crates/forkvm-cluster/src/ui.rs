//! The dashboard through the gateway.
//!
//! Its files are every node's (`/ui/...`, served by whichever live node,
//! with the cluster token), so the gateway needs none of its own. Its login
//! is the gateway's: `/ui/login` takes the endpoint token once and sets the
//! same session cookie a daemon would (a digest of the token), which the
//! gateway then accepts in place of the bearer token; the dashboard's API
//! calls are routed like any others.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, Response, StatusCode};
use axum::response::{Html, IntoResponse, Redirect};
use axum::routing::{get, post};
use axum::{Form, Router};

use crate::server::{constant_time_eq, no_node, to_node};
use crate::state::Gateway;

/// Paths that answer without auth: the login itself.
pub fn is_public(path: &str) -> bool {
    path == "/ui/login" || path == "/ui/logout"
}

pub fn is_ui(path: &str) -> bool {
    path == "/ui" || path.starts_with("/ui/")
}

/// Send a browser without a session to the login page.
pub fn to_login() -> Response<Body> {
    let mut r = Redirect::to("/ui/login").into_response();
    *r.status_mut() = StatusCode::SEE_OTHER;
    r
}

#[derive(serde::Deserialize)]
struct Login {
    #[serde(default)]
    token: String,
}

pub fn routes(gw: Arc<Gateway>) -> Router {
    let files = {
        let gw = gw.clone();
        move |req: Request| {
            let gw = gw.clone();
            async move {
                match crate::branch::emptiest(&gw) {
                    Some(n) => to_node(&gw, &n, req).await,
                    None => no_node(),
                }
            }
        }
    };
    let token = gw.cfg.client_token.clone();
    Router::new()
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/", get(files.clone()))
        .route("/ui/{*path}", get(files.clone()))
        .route(
            "/ui/login",
            get(files).post(move |form: Form<Login>| {
                let token = token.clone();
                async move { login(&token, &form.token) }
            }),
        )
        .route("/ui/logout", post(logout))
}

fn login(token: &str, given: &str) -> Response<Body> {
    if !constant_time_eq(given.trim().as_bytes(), token.as_bytes()) {
        return (
            StatusCode::UNAUTHORIZED,
            Html(
                "<!doctype html><title>forkvm</title><p role=\"alert\">Wrong token. Use the \
                 cluster endpoint's token (FORKVM_TOKEN in the cluster's cluster.json).</p>\
                 <p><a href=\"/ui/login\">Try again</a></p>",
            ),
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

async fn logout() -> Response<Body> {
    let mut r = Redirect::to("/ui/login").into_response();
    *r.status_mut() = StatusCode::SEE_OTHER;
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(forkvm_listen::session::LOGOUT_COOKIE),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_sets_the_session_for_the_endpoint_token_only() {
        assert_eq!(login("right", "wrong").status(), StatusCode::UNAUTHORIZED);
        let r = login("right", " right ");
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
        let c = r.headers()[header::SET_COOKIE].to_str().unwrap();
        assert!(
            c.contains(&forkvm_listen::session::session_value("right")),
            "{c}"
        );
        assert!(is_public("/ui/login") && !is_public("/ui/"));
        assert!(is_ui("/ui") && is_ui("/ui/assets/x.js") && !is_ui("/uix"));
    }
}
