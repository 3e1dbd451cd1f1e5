//! The Connect protocol (connectrpc.com/docs/protocol), JSON codec only, as
//! the E2B SDKs speak it to envd over HTTP/1.1.
//!
//! Every call is `POST /<package>.<Service>/<Method>`.
//!
//! **Unary** (`Content-Type: application/json`): the body is the request
//! message as proto3 JSON; a success is `200` with the response message as
//! JSON. An error is a non-200 status chosen by its code (table in
//! [`Code::http_status`]) with the body `{"code": "not_found", "message"}`.
//!
//! **Streaming** (`Content-Type: application/connect+json`): both bodies are
//! sequences of envelopes:
//!
//! ```text
//!  0        1        2        3        4        5 ...
//! +--------+--------+--------+--------+--------+-----------------+
//! | flags  | length (u32, big-endian)          | JSON, `length`  |
//! +--------+--------+--------+--------+--------+-----------------+
//!  flags: 0x01 compressed (never used here: refused)
//!         0x02 end of stream (server to client only)
//! ```
//!
//! A server stream (Start, Connect, WatchDir) answers `200` at once, then
//! one data envelope per message, then exactly one end-stream envelope whose
//! JSON is `{}` on success or `{"error": {"code","message"}, "metadata"}`.
//! An error found before the first message still travels in the end-stream
//! envelope with status `200`, as the protocol says. A client stream
//! (StreamInput) sends data envelopes in the request body and gets one data
//! envelope and the end-stream envelope back.
//!
//! Compression is never negotiated: the SDKs turn it off (they send
//! `Connect-Accept-Encoding` empty and no `Connect-Content-Encoding`), so a
//! request that does compress is answered `unimplemented` instead of being
//! guessed at.

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::error::EngineError;

/// Content type of a unary call (and of every error answer).
pub const UNARY_JSON: &str = "application/json";
/// Content type of a streaming call.
pub const STREAM_JSON: &str = "application/connect+json";

/// Envelope flag: the payload is compressed.
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Envelope flag: the last envelope of a server stream.
pub const FLAG_END_STREAM: u8 = 0x02;
/// Largest envelope accepted from a client: stdin chunks and paths are small,
/// and the daemon must not buffer an arbitrary length a client announces.
pub const MAX_ENVELOPE: usize = 16 << 20;

/// The Connect error codes (the gRPC set, by their snake-case names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)] // the protocol's whole set, not only the codes sent today
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code, per the protocol's
    /// table (clients map the status back when the body is not Connect's).
    pub fn http_status(self) -> StatusCode {
        let n = match self {
            Code::Canceled => 499,
            Code::Unknown | Code::Internal | Code::DataLoss => 500,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists | Code::Aborted => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::Unauthenticated => 401,
        };
        StatusCode::from_u16(n).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

/// A Connect error: a code and a message for the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectError {
    pub code: Code,
    pub message: String,
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code.as_str(), "message": self.message})
    }
}

impl From<EngineError> for ConnectError {
    /// The daemon's errors by their HTTP status: the SDKs branch on
    /// `not_found` (a missing process or file) and `already_exists`.
    fn from(e: EngineError) -> Self {
        let code = match crate::api::error::status(&e).as_u16() {
            400 => Code::InvalidArgument,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::NotFound,
            409 => Code::FailedPrecondition,
            413 | 429 => Code::ResourceExhausted,
            501 => Code::Unimplemented,
            502 | 503 => Code::Unavailable,
            504 => Code::DeadlineExceeded,
            _ => Code::Internal,
        };
        ConnectError::new(code, e.message)
    }
}

impl IntoResponse for ConnectError {
    /// The unary form of an error.
    fn into_response(self) -> Response {
        let body = self.json().to_string();
        (
            self.code.http_status(),
            [(header::CONTENT_TYPE, HeaderValue::from_static(UNARY_JSON))],
            body,
        )
            .into_response()
    }
}

/// The answer of a unary call: the message as JSON, or the error.
pub fn unary<T: Serialize>(r: Result<T, ConnectError>) -> Response {
    match r.and_then(|m| {
        serde_json::to_vec(&m).map_err(|e| ConnectError::new(Code::Internal, e.to_string()))
    }) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, HeaderValue::from_static(UNARY_JSON))],
            body,
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

/// Parse a unary request: a JSON body (an empty one is the empty message).
pub fn unary_request<T: DeserializeOwned>(
    content_type: Option<&str>,
    body: &[u8],
) -> Result<T, ConnectError> {
    let ct = media_type(content_type);
    if ct != UNARY_JSON {
        return Err(ConnectError::new(
            Code::Unimplemented,
            format!(
                "content type {ct:?} is not served; this envd speaks Connect's JSON ({UNARY_JSON})"
            ),
        ));
    }
    decode_json(if body.is_empty() { b"{}" } else { body })
}

/// Parse the request of a server-streaming call: exactly one data envelope.
pub fn stream_request<T: DeserializeOwned>(
    content_type: Option<&str>,
    body: &[u8],
) -> Result<T, ConnectError> {
    check_stream_type(content_type)?;
    let mut buf = body;
    match next_envelope(&mut buf)? {
        Some(env) if env.flags & FLAG_END_STREAM == 0 && buf.is_empty() => decode_json(&env.data),
        Some(_) => Err(ConnectError::invalid(
            "a server-streaming request carries exactly one message envelope",
        )),
        None => Err(ConnectError::invalid("the request has no message envelope")),
    }
}

/// The content type must be Connect's streaming JSON.
pub fn check_stream_type(content_type: Option<&str>) -> Result<(), ConnectError> {
    let ct = media_type(content_type);
    if ct != STREAM_JSON {
        return Err(ConnectError::new(
            Code::Unimplemented,
            format!("content type {ct:?} is not served; this envd speaks Connect's JSON ({STREAM_JSON})"),
        ));
    }
    Ok(())
}

fn media_type(content_type: Option<&str>) -> String {
    content_type
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

fn decode_json<T: DeserializeOwned>(data: &[u8]) -> Result<T, ConnectError> {
    serde_json::from_slice(data)
        .map_err(|e| ConnectError::invalid(format!("the request message is not valid: {e}")))
}

/// One envelope of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub flags: u8,
    pub data: Bytes,
}

/// Take the next whole envelope off the front of `buf`: `Ok(None)` when
/// `buf` is empty, an error when it holds only part of one (a client that
/// hung up mid-message), announces more than [`MAX_ENVELOPE`] or is
/// compressed.
pub fn next_envelope(buf: &mut &[u8]) -> Result<Option<Envelope>, ConnectError> {
    match split_envelope(buf)? {
        Some((env, used)) => {
            *buf = &buf[used..];
            Ok(Some(env))
        }
        None if buf.is_empty() => Ok(None),
        None => Err(ConnectError::invalid(format!(
            "the request ends inside an envelope ({} bytes left over)",
            buf.len()
        ))),
    }
}

/// Parse an envelope at the front of `buf` if it is all there: the
/// envelope and the bytes it took; `Ok(None)` when more bytes are needed.
pub fn split_envelope(buf: &[u8]) -> Result<Option<(Envelope, usize)>, ConnectError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let flags = buf[0];
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if flags & FLAG_COMPRESSED != 0 {
        return Err(ConnectError::new(
            Code::Unimplemented,
            "compressed envelopes are not accepted; send them uncompressed",
        ));
    }
    if len > MAX_ENVELOPE {
        return Err(ConnectError::new(
            Code::ResourceExhausted,
            format!("an envelope of {len} bytes is over the limit of {MAX_ENVELOPE}"),
        ));
    }
    if buf.len() < 5 + len {
        return Ok(None);
    }
    let data = Bytes::copy_from_slice(&buf[5..5 + len]);
    Ok(Some((Envelope { flags, data }, 5 + len)))
}

/// One envelope, ready to send.
pub fn envelope(flags: u8, data: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + data.len());
    b.put_u8(flags);
    b.put_u32(data.len() as u32);
    b.put_slice(data);
    b.freeze()
}

/// A data envelope holding `msg` as JSON.
pub fn data_envelope<T: Serialize>(msg: &T) -> Bytes {
    // Serializing our own message types cannot fail (no maps with non-string
    // keys, no floats); an empty object keeps the stream well-formed anyway.
    let json = serde_json::to_vec(msg).unwrap_or_else(|_| b"{}".to_vec());
    envelope(0, &json)
}

/// The end-stream envelope: `{}`, or the error, plus any trailing
/// metadata (`{"key": ["value", ...]}`).
pub fn end_envelope(error: Option<&ConnectError>, metadata: &[(&str, &str)]) -> Bytes {
    let mut end = serde_json::Map::new();
    if let Some(e) = error {
        end.insert("error".into(), e.json());
    }
    if !metadata.is_empty() {
        let mut m = serde_json::Map::new();
        for (k, v) in metadata {
            let entry = m
                .entry(k.to_string())
                .or_insert_with(|| serde_json::Value::Array(Vec::new()));
            if let serde_json::Value::Array(a) = entry {
                a.push(serde_json::Value::String(v.to_string()));
            }
        }
        end.insert("metadata".into(), serde_json::Value::Object(m));
    }
    envelope(
        FLAG_END_STREAM,
        serde_json::Value::Object(end).to_string().as_bytes(),
    )
}

/// The sending half of a server stream.
pub struct StreamTx {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
}

impl StreamTx {
    /// Send one message; false once the client has gone away.
    pub async fn send<T: Serialize>(&self, msg: &T) -> bool {
        self.tx.send(Ok(data_envelope(msg))).await.is_ok()
    }

    /// End the stream, with an error or without.
    pub async fn end(self, error: Option<ConnectError>) {
        let _ = self.tx.send(Ok(end_envelope(error.as_ref(), &[]))).await;
    }
}

/// A server-stream response and the sender feeding it. The response is
/// `200` at once; what follows are envelopes.
pub fn stream_response() -> (StreamTx, Response) {
    // A few messages of slack: output comes in bursts, and a client that
    // stops reading must slow the producer down rather than grow a buffer.
    let (tx, rx) = mpsc::channel(16);
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let resp = (
        StatusCode::OK,
        [(header::CONTENT_TYPE, HeaderValue::from_static(STREAM_JSON))],
        body,
    )
        .into_response();
    (StreamTx { tx }, resp)
}

/// A whole streaming answer that is only an error (found before the
/// stream began): still `200`, the error in the end-stream envelope.
pub fn stream_error(e: ConnectError) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, HeaderValue::from_static(STREAM_JSON))],
        end_envelope(Some(&e), &[]),
    )
        .into_response()
}

/// The answer of a client stream: one message, then the end of the
/// stream; or the error alone.
pub fn client_stream_answer<T: Serialize>(r: Result<T, ConnectError>) -> Response {
    match r {
        Ok(m) => {
            let mut b = BytesMut::new();
            b.extend_from_slice(&data_envelope(&m));
            b.extend_from_slice(&end_envelope(None, &[]));
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, HeaderValue::from_static(STREAM_JSON))],
                b.freeze(),
            )
                .into_response()
        }
        Err(e) => stream_error(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body_of(r: Response) -> Vec<u8> {
        r.into_body().collect().await.unwrap().to_bytes().to_vec()
    }

    #[derive(Debug, serde::Deserialize, serde::Serialize, PartialEq)]
    struct Msg {
        #[serde(default)]
        path: String,
    }

    #[tokio::test]
    async fn unary_request_and_response() {
        let m: Msg =
            unary_request(Some("application/json; charset=utf-8"), br#"{"path":"/a"}"#).unwrap();
        assert_eq!(m.path, "/a");
        // An empty body is the empty message.
        let m: Msg = unary_request(Some("application/json"), b"").unwrap();
        assert_eq!(m.path, "");
        let r = unary(Ok(Msg { path: "/b".into() }));
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[header::CONTENT_TYPE], UNARY_JSON);
        assert_eq!(body_of(r).await, br#"{"path":"/b"}"#);
        // Only JSON is spoken.
        let e = unary_request::<Msg>(Some("application/proto"), b"").unwrap_err();
        assert_eq!(e.code, Code::Unimplemented);
    }

    #[tokio::test]
    async fn unary_error_maps_code_to_status() {
        for (code, status) in [
            (Code::NotFound, 404),
            (Code::InvalidArgument, 400),
            (Code::AlreadyExists, 409),
            (Code::Unavailable, 503),
            (Code::DeadlineExceeded, 504),
            (Code::Canceled, 499),
            (Code::ResourceExhausted, 429),
            (Code::Unauthenticated, 401),
            (Code::Unimplemented, 501),
            (Code::Internal, 500),
        ] {
            let r = unary::<Msg>(Err(ConnectError::new(code, "m")));
            assert_eq!(r.status().as_u16(), status, "{code:?}");
            assert_eq!(r.headers()[header::CONTENT_TYPE], UNARY_JSON);
            let v: serde_json::Value = serde_json::from_slice(&body_of(r).await).unwrap();
            assert_eq!(v["code"], code.as_str());
            assert_eq!(v["message"], "m");
        }
        let e: ConnectError = EngineError::not_found("no such file").into();
        assert_eq!(e.code, Code::NotFound);
    }

    #[test]
    fn data_envelope_layout() {
        let b = data_envelope(&Msg { path: "/x".into() });
        assert_eq!(b[0], 0);
        assert_eq!(
            u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize,
            b.len() - 5
        );
        assert_eq!(&b[5..], br#"{"path":"/x"}"#);
    }

    #[test]
    fn end_envelope_with_and_without_error_and_metadata() {
        let b = end_envelope(None, &[]);
        assert_eq!(b[0], FLAG_END_STREAM);
        assert_eq!(&b[5..], b"{}");
        let e = ConnectError::new(Code::NotFound, "no process 7");
        let b = end_envelope(Some(&e), &[("x-a", "1"), ("x-a", "2")]);
        assert_eq!(b[0], FLAG_END_STREAM);
        let v: serde_json::Value = serde_json::from_slice(&b[5..]).unwrap();
        assert_eq!(v["error"]["code"], "not_found");
        assert_eq!(v["error"]["message"], "no process 7");
        assert_eq!(v["metadata"]["x-a"], serde_json::json!(["1", "2"]));
        let b = end_envelope(None, &[("k", "v")]);
        let v: serde_json::Value = serde_json::from_slice(&b[5..]).unwrap();
        assert!(v.get("error").is_none());
        assert_eq!(v["metadata"]["k"], serde_json::json!(["v"]));
    }

    #[test]
    fn client_stream_request_parses_envelope_by_envelope() {
        let mut body = Vec::new();
        body.extend_from_slice(&envelope(0, br#"{"path":"/1"}"#));
        body.extend_from_slice(&envelope(0, br#"{"path":"/2"}"#));
        let mut buf = &body[..];
        let a = next_envelope(&mut buf).unwrap().unwrap();
        let b = next_envelope(&mut buf).unwrap().unwrap();
        assert_eq!(&a.data[..], br#"{"path":"/1"}"#);
        assert_eq!(&b.data[..], br#"{"path":"/2"}"#);
        assert_eq!(next_envelope(&mut buf).unwrap(), None);
        // Incremental: a partial envelope asks for more.
        assert_eq!(split_envelope(&body[..7]).unwrap(), None);
        // A server-streaming request is one envelope.
        let m: Msg = stream_request(Some(STREAM_JSON), &envelope(0, br#"{"path":"/s"}"#)).unwrap();
        assert_eq!(m.path, "/s");
        assert!(stream_request::<Msg>(Some(STREAM_JSON), &body).is_err());
        assert!(stream_request::<Msg>(Some(UNARY_JSON), &body[..18]).is_err());
    }

    #[test]
    fn compressed_envelope_is_refused() {
        let b = envelope(FLAG_COMPRESSED, b"\x1f\x8b");
        let e = split_envelope(&b).unwrap_err();
        assert_eq!(e.code, Code::Unimplemented);
    }

    #[test]
    fn truncated_and_oversized_envelopes_are_refused() {
        let b = envelope(0, br#"{"path":"/a"}"#);
        let mut buf = &b[..b.len() - 1];
        assert_eq!(
            next_envelope(&mut buf).unwrap_err().code,
            Code::InvalidArgument
        );
        let mut buf: &[u8] = &[0, 0, 0];
        assert!(next_envelope(&mut buf).is_err());
        let huge = [0u8, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(
            split_envelope(&huge).unwrap_err().code,
            Code::ResourceExhausted
        );
    }

    #[tokio::test]
    async fn stream_error_is_200_with_end_envelope() {
        let r = stream_error(ConnectError::new(Code::NotFound, "gone"));
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[header::CONTENT_TYPE], STREAM_JSON);
        let b = body_of(r).await;
        assert_eq!(b[0], FLAG_END_STREAM);
        let v: serde_json::Value = serde_json::from_slice(&b[5..]).unwrap();
        assert_eq!(v["error"]["code"], "not_found");
    }

    #[tokio::test]
    async fn server_stream_sends_data_then_end() {
        let (tx, resp) = stream_response();
        tokio::spawn(async move {
            assert!(tx.send(&Msg { path: "/1".into() }).await);
            tx.end(None).await;
        });
        let b = body_of(resp).await;
        let mut buf = &b[..];
        let d = next_envelope(&mut buf).unwrap().unwrap();
        assert_eq!(d.flags, 0);
        let e = next_envelope(&mut buf).unwrap().unwrap();
        assert_eq!(e.flags, FLAG_END_STREAM);
        assert_eq!(&e.data[..], b"{}");
        assert!(buf.is_empty());
    }
}
