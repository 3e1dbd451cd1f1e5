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
//! | `request_timeout` | 408 | the request body did not arrive in time |
//! | `limit_exceeded` | 429 | too many sandboxes or requests |
//! | `guest_error` | 502 | the guest agent reported an error or went away |
//! | `guest_timeout` | 504 | the guest agent did not answer in time |
//! | `qemu_failed` | 500 | QEMU could not be started or died |
//! | `network_failed` | 500 | the sandbox's network could not be set up |
//! | `network_unavailable` | 503 | this host cannot give sandboxes a network (see `forkvm doctor`) |
//! | `registry_auth_failed` | 403 | a registry refused the credentials |
//! | `invalid_image` | 422 | an image's blobs fail verification, its archive or manifest is malformed, or it has no linux/amd64 variant |
//! | `incompatible_snapshot` | 422 | a pulled snapshot cannot be restored on this host (QEMU release, machine, accelerator, CPU, guest kernel); nothing was written |
//! | `build_failed` | 422 | a Dockerfile is invalid or one of its steps failed |
//! | `registry_unreachable` | 502 | a registry could not be reached or answered nonsense |
//! | `no_space` | 507 | the host filesystem holding FORKVM_HOME is full (or under the daemon's reserve) |
//! | `capacity_exceeded` | 503 | the spawn, branch or resume would pass the host's memory commitment |
//! | `node_lost` | 410 | (cluster gateway) the sandbox was on a node the cluster declared dead; its state is gone |
//! | `node_unreachable` | 503 | (cluster gateway) the node holding the sandbox or snapshot does not answer; retry, or wait until it is declared dead |
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
pub const NETWORK_FAILED: &str = "network_failed";
pub const NETWORK_UNAVAILABLE: &str = "network_unavailable";
pub const REGISTRY_AUTH_FAILED: &str = "registry_auth_failed";
pub const INVALID_IMAGE: &str = "invalid_image";
pub const BUILD_FAILED: &str = "build_failed";
pub const REGISTRY_UNREACHABLE: &str = "registry_unreachable";
pub const NO_SPACE: &str = "no_space";
pub const CAPACITY_EXCEEDED: &str = "capacity_exceeded";
pub const INCOMPATIBLE_SNAPSHOT: &str = "incompatible_snapshot";
pub const NODE_LOST: &str = "node_lost";
pub const NODE_UNREACHABLE: &str = "node_unreachable";

/// The HTTP status a code is sent with (the table above). A streamed exec
/// reports a late error as a code inside a 200 response; clients use this to
/// give it the status it would have had.
pub fn status_of(code: &str) -> u16 {
    match code {
        INVALID_REQUEST => 400,
        UNAUTHORIZED => 401,
        NOT_FOUND | IMAGE_NOT_FOUND => 404,
        REQUEST_TIMEOUT => 408,
        REGISTRY_AUTH_FAILED => 403,
        CONFLICT => 409,
        PAYLOAD_TOO_LARGE => 413,
        SNAPSHOT_CORRUPT | INVALID_IMAGE | BUILD_FAILED | INCOMPATIBLE_SNAPSHOT => 422,
        LIMIT_EXCEEDED => 429,
        GUEST_ERROR | REGISTRY_UNREACHABLE => 502,
        NETWORK_UNAVAILABLE | CAPACITY_EXCEEDED => 503,
        GUEST_TIMEOUT => 504,
        NO_SPACE => 507,
        _ => 500,
    }
}
