//! envd's `filesystem.Filesystem` service over the daemon's filesystem
//! actions ([`Engine`](crate::actions::Engine)): each method parses its
//! Connect request, calls one engine action and renders the answer.
//!
//! Relative paths are taken from the user's home directory, as envd does
//! ([`Call::resolve`]). `MakeDir` runs as the user, so what it makes is
//! theirs; the other operations run as the guest agent (root): a username
//! does not narrow what they may see or change (see `docs/e2b.md`).

use axum::response::Response;

use super::connect::{self, Code, ConnectError};
use super::wire::*;
use super::Call;
use crate::actions::WatchEvent;
use crate::error::agent_error;

/// `Stat`.
pub(crate) async fn stat(call: Call) -> Response {
    connect::unary(
        async {
            let req: PathRequest = connect::unary_request(call.content_type(), &call.body)?;
            let path = call.resolve(&req.path)?;
            let mut entry = call.mgr.stat_file(&call.id, &path).await?;
            // envd's Stat describes what a symlink points at (its kind and
            // size, and the target as an absolute path), keeping the link's
            // own name and path.
            if let (forkvm_api::FileKind::Symlink, Some(to)) =
                (entry.kind, entry.symlink_target.clone())
            {
                let target = if to.starts_with('/') {
                    to
                } else {
                    let dir = path.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
                    format!("{dir}/{to}")
                };
                if let Ok(t) = call.mgr.stat_file(&call.id, &target).await {
                    entry.kind = t.kind;
                    entry.size = t.size;
                    // envd gives the target as an absolute path.
                    entry.symlink_target = Some(target);
                }
            }
            Ok(EntryResponse {
                entry: entry.into(),
            })
        }
        .await,
    )
}

/// `MakeDir`: `mkdir -p`; a directory that was there already is
/// `already_exists`, which the SDKs turn into `false`.
pub(crate) async fn make_dir(call: Call) -> Response {
    connect::unary(
        async {
            let req: PathRequest = connect::unary_request(call.content_type(), &call.body)?;
            let path = call.resolve(&req.path)?;
            let user = call.effective_user();
            // As envd does, the directories are made by the user, so they
            // are theirs (a later `ln -s` or write in them as that user works).
            let made = call
                .mgr
                .make_dir_as(&call.id, &path, user.as_deref())
                .await?;
            if made.existed {
                return Err(exists(&path));
            }
            Ok(EntryResponse {
                entry: made.entry.into(),
            })
        }
        .await,
    )
}

/// `Move`.
pub(crate) async fn move_entry(call: Call) -> Response {
    connect::unary(
        async {
            let req: MoveRequest = connect::unary_request(call.content_type(), &call.body)?;
            let source = call.resolve(&req.source)?;
            let destination = call.resolve(&req.destination)?;
            let entry = call.mgr.move_file(&call.id, &source, &destination).await?;
            Ok(EntryResponse {
                entry: entry.into(),
            })
        }
        .await,
    )
}

/// `ListDir`: `depth` levels down (0, the proto default, counts as 1).
pub(crate) async fn list_dir(call: Call) -> Response {
    connect::unary(
        async {
            let req: ListDirRequest = connect::unary_request(call.content_type(), &call.body)?;
            let path = call.resolve(&req.path)?;
            let list = call.mgr.list_dir(&call.id, &path, req.depth.max(1)).await?;
            Ok(ListDirResponse {
                entries: list.entries.into_iter().map(EntryInfo::from).collect(),
            })
        }
        .await,
    )
}

/// `Remove`: a file, or a directory with all it holds; a missing path is
/// not an error.
pub(crate) async fn remove(call: Call) -> Response {
    connect::unary(
        async {
            let req: PathRequest = connect::unary_request(call.content_type(), &call.body)?;
            let path = call.resolve(&req.path)?;
            // envd removes as `rm -rf` does: a path that is not there is
            // already removed.
            match call.mgr.remove_file(&call.id, &path).await {
                Err(e) if e.kind == crate::error::ErrorKind::NotFound => Ok(Empty {}),
                r => r.map(|()| Empty {}).map_err(Into::into),
            }
        }
        .await,
    )
}

fn check_watch(req: &WatchRequest) -> Result<(), ConnectError> {
    // Both need more than this envd reports being (0.6.3 and 0.6.4), so an
    // SDK never asks; a hand-made request is told so rather than ignored.
    if req.include_entry {
        return Err(ConnectError::new(
            Code::Unimplemented,
            "includeEntry is not supported by this envd; stat the entries instead",
        ));
    }
    if req.allow_network_mounts {
        return Err(ConnectError::new(
            Code::Unimplemented,
            "allowNetworkMounts is not supported by this envd",
        ));
    }
    Ok(())
}

/// `WatchDir` (server streaming): `start` once the watch is in place, then
/// one `filesystem` message per change, until the client goes away (which
/// ends the watch in the guest) or the directory does.
pub(crate) async fn watch_dir(call: Call) -> Response {
    let r = async {
        let req: WatchRequest = connect::stream_request(call.content_type(), &call.body)?;
        check_watch(&req)?;
        let path = call.resolve(&req.path)?;
        Ok::<_, ConnectError>(call.mgr.watch_dir(&call.id, &path, req.recursive).await?)
    }
    .await;
    let mut w = match r {
        Ok(w) => w,
        Err(e) => return connect::stream_error(e),
    };
    let (tx, resp) = connect::stream_response();
    let id = call.id;
    let deadline = call.deadline;
    tokio::spawn(async move {
        if !tx.send(&WatchDirResponse::Start(Empty {})).await {
            return;
        }
        loop {
            let next = tokio::select! {
                n = w.next() => n,
                () = super::deadline::reached(deadline) => {
                    return tx.end(Some(super::deadline::exceeded())).await;
                }
            };
            match next {
                Ok(Some(WatchEvent::Started)) => {}
                Ok(Some(WatchEvent::Events { events, .. })) => {
                    for e in crate::actions::fs_events(events) {
                        let msg = WatchDirResponse::Filesystem(e.into());
                        if !tx.send(&msg).await {
                            return;
                        }
                    }
                }
                Ok(Some(WatchEvent::Keepalive)) => {
                    if !tx.send(&WatchDirResponse::Keepalive(Empty {})).await {
                        return;
                    }
                }
                Ok(None) => return tx.end(None).await,
                Err(e) => {
                    let e = agent_error(&id, e);
                    return tx.end(Some(e.into())).await;
                }
            }
        }
    });
    resp
}

/// `CreateWatcher`: a watcher to poll with `GetWatcherEvents`.
pub(crate) async fn create_watcher(call: Call) -> Response {
    connect::unary(
        async {
            let req: WatchRequest = connect::unary_request(call.content_type(), &call.body)?;
            check_watch(&req)?;
            let path = call.resolve(&req.path)?;
            let watcher_id = call
                .mgr
                .create_watcher(&call.id, &path, req.recursive)
                .await?;
            Ok(CreateWatcherResponse { watcher_id })
        }
        .await,
    )
}

/// `GetWatcherEvents`: what the watcher saw since the last poll.
pub(crate) async fn get_watcher_events(call: Call) -> Response {
    connect::unary(
        async {
            let req: WatcherRequest = connect::unary_request(call.content_type(), &call.body)?;
            let got = call.mgr.poll_watcher(&call.id, &req.watcher_id).await?;
            Ok(GetWatcherEventsResponse {
                events: got.events.into_iter().map(FilesystemEvent::from).collect(),
            })
        }
        .await,
    )
}

fn exists(path: &str) -> ConnectError {
    ConnectError::new(
        Code::AlreadyExists,
        format!("directory {path} already exists"),
    )
}

/// `RemoveWatcher`.
pub(crate) async fn remove_watcher(call: Call) -> Response {
    connect::unary(
        async {
            let req: WatcherRequest = connect::unary_request(call.content_type(), &call.body)?;
            call.mgr.remove_watcher(&call.id, &req.watcher_id).await?;
            Ok(Empty {})
        }
        .await,
    )
}
