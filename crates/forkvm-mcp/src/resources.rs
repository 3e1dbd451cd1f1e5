//! Resources: what a client can read without a tool call.
//!
//! Each sandbox offers its console (the guest's serial output, the tail the
//! daemon keeps) and its files:
//!
//! * `forkvm://sandboxes/{sandbox_id}/console`: listed by `resources/list`,
//!   one per sandbox;
//! * `forkvm://sandboxes/{sandbox_id}/files/{+path}`: any file by its
//!   absolute path, e.g. `forkvm://sandboxes/sb-1/files/root/notes.txt` is
//!   `/root/notes.txt`. Not listed (a disk has too many files to list);
//!   `list_files` finds them.
//!
//! Both are also offered as templates, by sandbox id. Text that is UTF-8
//! comes back as `text`, anything else as a base64 `blob`.

use base64::Engine;
use rmcp::model::{
    ListResourceTemplatesResult, ListResourcesResult, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate,
};
use rmcp::ErrorData;

use crate::{error_text, Backend, BackendError};

pub const SCHEME: &str = "forkvm://sandboxes/";
pub const CONSOLE_TEMPLATE: &str = "forkvm://sandboxes/{sandbox_id}/console";
pub const FILES_TEMPLATE: &str = "forkvm://sandboxes/{sandbox_id}/files/{+path}";

/// What a resource URI names.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    Console { id: String },
    File { id: String, path: String },
}

/// A console's URI.
pub fn console_uri(id: &str) -> String {
    format!("{SCHEME}{id}/console")
}

/// Read a resource URI of ours; `None` for any other.
pub fn parse(uri: &str) -> Option<Target> {
    let rest = uri.strip_prefix(SCHEME)?;
    let (id, what) = rest.split_once('/')?;
    let id = decode(id)?;
    if id.is_empty() || id.contains('/') {
        return None;
    }
    if what == "console" {
        return Some(Target::Console { id });
    }
    let path = decode(what.strip_prefix("files/")?)?;
    let path = format!("/{}", path.trim_start_matches('/'));
    if path.split('/').any(|c| c == "..") {
        return None;
    }
    Some(Target::File { id, path })
}

/// Percent-decoding (a URI template's expansion encodes what is not
/// allowed in a URI); `None` for a bad escape or bytes that are not UTF-8.
fn decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `resources/list`: every sandbox's console.
pub async fn list(b: &impl Backend) -> Result<ListResourcesResult, ErrorData> {
    let sandboxes = b.list().await.map_err(|e| failed("resources/list", &e))?;
    let items = sandboxes
        .iter()
        .map(|s| {
            Resource::new(console_uri(&s.id), format!("{} console", s.id))
                .with_title(format!("Console of sandbox {}", s.id))
                .with_description(format!(
                    "The serial console of sandbox {} (image {}, {}): kernel and boot \
                     messages, the last MiB",
                    s.id,
                    s.image,
                    serde_json::to_value(s.state)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                ))
                .with_mime_type("text/plain")
        })
        .collect();
    Ok(ListResourcesResult::with_all_items(items))
}

/// `resources/templates/list`.
pub fn templates() -> ListResourceTemplatesResult {
    ListResourceTemplatesResult::with_all_items(vec![
        ResourceTemplate::new(CONSOLE_TEMPLATE, "console")
            .with_title("A sandbox's console")
            .with_description(
                "The serial console of a sandbox (kernel and boot messages, the last MiB), \
                 by its id",
            )
            .with_mime_type("text/plain"),
        ResourceTemplate::new(FILES_TEMPLATE, "file")
            .with_title("A file in a sandbox")
            .with_description(
                "A file in a sandbox by its id and absolute path: \
                 forkvm://sandboxes/sb-1/files/root/notes.txt is /root/notes.txt. \
                 UTF-8 text comes back as text, anything else as a base64 blob.",
            ),
    ])
}

/// `resources/read`.
pub async fn read(b: &impl Backend, uri: &str) -> Result<ReadResourceResult, ErrorData> {
    let target = parse(uri).ok_or_else(|| {
        ErrorData::resource_not_found(
            format!(
                "no resource {uri:?}: forkvm's are {CONSOLE_TEMPLATE} and {FILES_TEMPLATE} \
                 (see resources/templates/list)"
            ),
            None,
        )
    })?;
    let contents = match target {
        Target::Console { id } => {
            let text = b.logs(id).await.map_err(|e| failed("resources/read", &e))?;
            ResourceContents::text(text, uri)
        }
        Target::File { id, path } => {
            let data = b
                .read_file(id, path)
                .await
                .map_err(|e| failed("resources/read", &e))?;
            match String::from_utf8(data) {
                Ok(text) => ResourceContents::text(text, uri),
                Err(e) => ResourceContents::BlobResourceContents {
                    uri: uri.to_string(),
                    mime_type: Some("application/octet-stream".into()),
                    blob: base64::engine::general_purpose::STANDARD.encode(e.into_bytes()),
                    meta: None,
                },
            }
        }
    };
    Ok(ReadResourceResult::new(vec![contents]))
}

/// A failed read: not found (`-32002`) for a 404, an internal error with
/// the daemon's message and what to do otherwise.
fn failed(what: &str, e: &BackendError) -> ErrorData {
    let text = error_text(what, e);
    if e.status == 404 {
        ErrorData::resource_not_found(text, None)
    } else {
        ErrorData::internal_error(text, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_name_a_console_or_a_file() {
        assert_eq!(
            parse("forkvm://sandboxes/sb-1/console"),
            Some(Target::Console { id: "sb-1".into() })
        );
        assert_eq!(
            parse("forkvm://sandboxes/sb-1/files/root/a%20b.txt"),
            Some(Target::File {
                id: "sb-1".into(),
                path: "/root/a b.txt".into()
            })
        );
        // A reserved expansion of "/etc/hosts" keeps its slash.
        assert_eq!(
            parse("forkvm://sandboxes/sb-1/files//etc/hosts"),
            Some(Target::File {
                id: "sb-1".into(),
                path: "/etc/hosts".into()
            })
        );
        for bad in [
            "file:///etc/hosts",
            "forkvm://sandboxes/",
            "forkvm://sandboxes/sb-1",
            "forkvm://sandboxes//console",
            "forkvm://sandboxes/sb-1/logs",
            "forkvm://sandboxes/sb-1/files/../etc",
            "forkvm://sandboxes/sb-1/files/a%zz",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
        assert_eq!(
            parse(&console_uri("sb-9")),
            Some(Target::Console { id: "sb-9".into() })
        );
    }
}
