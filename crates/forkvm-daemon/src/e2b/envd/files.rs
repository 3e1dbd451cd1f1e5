//! envd's `/files`: download one file (`GET`) and upload one or several
//! (`POST`).
//!
//! * `GET /files?path=&username=` answers the file's bytes, or
//!   `{"code": 404, "message"}` when it is missing.
//! * `POST /files?path=&username=` takes either `multipart/form-data` with
//!   one or more file parts (each named by its `filename`, or by `path`
//!   when there is exactly one) or, since envd 0.5.7, the raw bytes as
//!   `application/octet-stream` (optionally `Content-Encoding: gzip`) for
//!   the one file at `path`. It answers `[{"name", "type": "file", "path"}]`.
//!
//! Missing parent directories are created. A file is written owned by the
//! user the request names, else the image's `User`, else root: it is
//! unpacked from a one-entry tar by the agent's archive operation, which
//! resolves that user in the guest.

use std::io::Read;

use axum::body::Bytes;
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;

use super::{basic_user, http_error, resolve_path, EnvdTarget};
use crate::actions::Engine;
use crate::error::{EngineError, ErrorKind};

/// `?path=&username=` (and the signature parameters of signed URLs, which
/// are not needed here: the access token already admitted the request).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct FileQuery {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    username: Option<String>,
}

fn api_error(e: EngineError) -> Response {
    http_error(crate::api::error::status(&e), e.to_string())
}

/// Who the request is for: `?username=`, else the `Authorization` header,
/// else the image's `User`.
fn user_of(
    m: &Engine,
    id: &str,
    q: &FileQuery,
    h: &HeaderMap,
) -> Result<Option<String>, EngineError> {
    let named = match q.username.clone().filter(|u| !u.is_empty()) {
        Some(u) => Some(u),
        None => basic_user(h).map_err(|e| EngineError::new(ErrorKind::Unauthorized, e.message))?,
    };
    Ok(named.or_else(|| m.exec_defaults(id).ok().and_then(|d| d.user)))
}

fn path_of(q: &FileQuery, user: Option<&str>) -> Result<String, EngineError> {
    let p = q.path.as_deref().ok_or_else(|| {
        EngineError::new(
            ErrorKind::Invalid,
            "name the file: ?path=/absolute/path (or a path relative to the user's home)",
        )
    })?;
    resolve_path(p, user).map_err(|e| EngineError::new(ErrorKind::Invalid, e.message))
}

/// `GET /files`.
pub(crate) async fn download(
    State(m): State<Engine>,
    Extension(t): Extension<EnvdTarget>,
    q: Result<Query<FileQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Response {
    let q = match q {
        Ok(Query(q)) => q,
        Err(e) => return http_error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let id = t.sandbox_id;
    let r = async {
        let user = user_of(&m, &id, &q, &headers)?;
        let path = path_of(&q, user.as_deref())?;
        let data = m.read_file(&id, &path).await?;
        let name = path.rsplit('/').next().unwrap_or("").replace('"', "");
        Ok::<_, EngineError>(
            (
                [
                    (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                    (
                        header::CONTENT_DISPOSITION,
                        format!("attachment; filename=\"{name}\""),
                    ),
                ],
                data,
            )
                .into_response(),
        )
    }
    .await;
    r.unwrap_or_else(api_error)
}

/// One file written: what the SDK's `WriteInfo` reads.
#[derive(Debug, serde::Serialize, PartialEq)]
struct Written {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
}

/// `POST /files`.
pub(crate) async fn upload(
    State(m): State<Engine>,
    Extension(t): Extension<EnvdTarget>,
    q: Result<Query<FileQuery>, axum::extract::rejection::QueryRejection>,
    req: Request,
) -> Response {
    let q = match q {
        Ok(Query(q)) => q,
        Err(e) => return http_error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let id = t.sandbox_id;
    let (parts, body) = req.into_parts();
    let r = async {
        let user = user_of(&m, &id, &q, &parts.headers)?;
        let limit = m.limits().max_request_bytes as usize;
        let body = axum::body::to_bytes(body, limit).await.map_err(|e| {
            EngineError::new(
                ErrorKind::TooLarge,
                format!("the upload is over the limit of {limit} bytes: {e}"),
            )
        })?;
        let ct = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let mut files: Vec<(String, Bytes)> = Vec::new();
        if let Some(boundary) = boundary_of(ct) {
            let parts =
                multipart(&boundary, &body).map_err(|e| EngineError::new(ErrorKind::Invalid, e))?;
            let single = parts.len() == 1;
            for (filename, data) in parts {
                let path = match (&q.path, filename) {
                    (Some(_), _) if single => path_of(&q, user.as_deref())?,
                    (_, Some(f)) => resolve_path(&f, user.as_deref())
                        .map_err(|e| EngineError::new(ErrorKind::Invalid, e.message))?,
                    (_, None) => {
                        return Err(EngineError::new(
                            ErrorKind::Invalid,
                            "each file part needs a filename (its path) when ?path= does \
                             not name the one file",
                        ))
                    }
                };
                files.push((path, data));
            }
        } else {
            let path = path_of(&q, user.as_deref())?;
            let gz = parts
                .headers
                .get(header::CONTENT_ENCODING)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.trim().eq_ignore_ascii_case("gzip"))
                .unwrap_or(false);
            let data = if gz { gunzip(&body, limit)? } else { body };
            files.push((path, data));
        }
        if files.is_empty() {
            return Err(EngineError::new(
                ErrorKind::Invalid,
                "the upload holds no file",
            ));
        }
        let mut out = Vec::new();
        for (path, data) in files {
            m.write_file_as(&id, &path, &data, user.as_deref()).await?;
            out.push(Written {
                name: path.rsplit('/').next().unwrap_or("").to_string(),
                kind: "file",
                path,
            });
        }
        Ok::<_, EngineError>(Json(out).into_response())
    }
    .await;
    r.unwrap_or_else(api_error)
}

fn gunzip(body: &[u8], limit: usize) -> Result<Bytes, EngineError> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| EngineError::new(ErrorKind::Invalid, format!("the gzip body is bad: {e}")))?;
    if out.len() > limit {
        return Err(EngineError::new(
            ErrorKind::TooLarge,
            format!("the file unpacks to over the limit of {limit} bytes"),
        ));
    }
    Ok(out.into())
}

/// The boundary of a `multipart/form-data` content type.
fn boundary_of(content_type: &str) -> Option<String> {
    let mut it = content_type.split(';');
    let media = it.next()?.trim().to_ascii_lowercase();
    if media != "multipart/form-data" {
        return None;
    }
    it.filter_map(|p| p.trim().split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("boundary"))
        .map(|(_, v)| v.trim().trim_matches('"').to_string())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The parts of a `multipart/form-data` body (RFC 7578) that are files:
/// their `filename` and bytes. Parts without a filename (plain form fields)
/// are skipped.
fn multipart(boundary: &str, body: &[u8]) -> Result<Vec<(Option<String>, Bytes)>, String> {
    let delim = format!("--{boundary}");
    let start = find(body, delim.as_bytes()).ok_or("the multipart body has no boundary")?;
    let mut rest = &body[start + delim.len()..];
    let sep = format!("\r\n--{boundary}");
    let mut out = Vec::new();
    loop {
        if rest.starts_with(b"--") {
            return Ok(out);
        }
        rest = rest
            .strip_prefix(b"\r\n")
            .ok_or("a multipart boundary is not followed by CRLF")?;
        let end = find(rest, sep.as_bytes()).ok_or("the multipart body is cut short")?;
        let part = &rest[..end];
        rest = &rest[end + sep.len()..];
        let hend = find(part, b"\r\n\r\n").ok_or("a multipart part has no header end")?;
        let head = String::from_utf8_lossy(&part[..hend]);
        let data = Bytes::copy_from_slice(&part[hend + 4..]);
        let disposition = head
            .split("\r\n")
            .find_map(|l| {
                l.split_once(':')
                    .filter(|(k, _)| k.trim().eq_ignore_ascii_case("content-disposition"))
                    .map(|(_, v)| v.to_string())
            })
            .unwrap_or_default();
        if let Some(f) = filename_of(&disposition) {
            out.push((Some(f), data));
        } else if disposition.contains("name=\"file\"") {
            out.push((None, data));
        }
    }
}

/// `filename="..."` of a Content-Disposition (quotes escaped as `%22` or
/// `\"`, as browsers and httpx write them).
fn filename_of(disposition: &str) -> Option<String> {
    let i = disposition.find("filename=")?;
    let v = &disposition[i + "filename=".len()..];
    let v = if let Some(q) = v.strip_prefix('"') {
        let mut s = String::new();
        let mut chars = q.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => s.extend(chars.next()),
                '"' => break,
                c => s.push(c),
            }
        }
        s
    } else {
        v.split(';').next().unwrap_or("").trim().to_string()
    };
    Some(v.replace("%22", "\"")).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_with_several_files() {
        let body = b"--XyZ\r\n\
Content-Disposition: form-data; name=\"file\"; filename=\"/tmp/a.txt\"\r\n\
Content-Type: application/octet-stream\r\n\r\n\
hello\r\n\
--XyZ\r\n\
Content-Disposition: form-data; name=\"file\"; filename=\"b \\\"q\\\".bin\"\r\n\r\n\
\x00\x01\r\n\r\n\
--XyZ--\r\n";
        assert_eq!(
            boundary_of("multipart/form-data; boundary=XyZ").as_deref(),
            Some("XyZ")
        );
        assert_eq!(boundary_of("application/octet-stream"), None);
        let parts = multipart("XyZ", body).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].0.as_deref(), Some("/tmp/a.txt"));
        assert_eq!(&parts[0].1[..], b"hello");
        assert_eq!(parts[1].0.as_deref(), Some("b \"q\".bin"));
        assert_eq!(&parts[1].1[..], b"\x00\x01\r\n");
    }

    #[test]
    fn multipart_cut_short_is_an_error() {
        let body =
            b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nhel";
        assert!(multipart("XyZ", body).is_err());
        assert!(multipart("XyZ", b"nothing").is_err());
    }

    #[test]
    fn gzip_bodies_unpack_within_the_limit() {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&[b'a'; 100]).unwrap();
        let gz = enc.finish().unwrap();
        assert_eq!(gunzip(&gz, 1000).unwrap().len(), 100);
        assert!(gunzip(&gz, 10).is_err());
        assert!(gunzip(b"not gzip", 10).is_err());
    }
}
