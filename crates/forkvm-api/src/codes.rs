//! Error codes carried in `{"error": {"code": ...}}`.
//!
//! | code | status | meaning |
//! |---|---|---|
//! | `invalid_request` | 400 | malformed JSON, unknown fields, bad values |
//! | `unauthorized` | 401 | missing or wrong bearer token on TCP |
//! | `not_found` | 404 | no such sandbox, route, or guest file |
//! | `image_not_found` | 404 | the image does not exist |
//! | `conflict` | 409 | the sandbox is not in a state that allows this |
//! | `snapshot_corrupt` | 422 | a snapshot file fails its checksum |
//! | `payload_too_large` | 413 | request body or guest file over the limit |
//! | `limit_exceeded` | 429 | too many sandboxes or requests |
//! | `guest_error` | 502 | the guest agent reported an error or went away |
//! | `guest_timeout` | 504 | the guest agent did not answer in time |
//! | `qemu_failed` | 500 | QEMU could not be started or died |
//! | `internal` | 500 | a bug or a host problem; the message says which |

pub const INVALID_REQUEST: &str = "invalid_request";
pub const UNAUTHORIZED: &str = "unauthorized";
pub const NOT_FOUND: &str = "not_found";
pub const IMAGE_NOT_FOUND: &str = "image_not_found";
pub const CONFLICT: &str = "conflict";
pub const PAYLOAD_TOO_LARGE: &str = "payload_too_large";
pub const LIMIT_EXCEEDED: &str = "limit_exceeded";
pub const REQUEST_TIMEOUT: &str = "request_timeout";
pub const GUEST_ERROR: &str = "guest_error";
pub const GUEST_TIMEOUT: &str = "guest_timeout";
pub const QEMU_FAILED: &str = "qemu_failed";
pub const INTERNAL: &str = "internal";
pub const SNAPSHOT_CORRUPT: &str = "snapshot_corrupt";
