//! `forkvm snapshot push|pull`: snapshots to and from OCI registries, with
//! progress on the terminal (docs/registry.md).

use anyhow::Result;
use forkvm_api::{Client, ImageEvent, PullSnapshot, PushSnapshot, TransferEvent};

use crate::args::RegistryArgs;
use crate::image::{read_password, Renderer};

/// Show a transfer event as the image renderer shows its like.
fn show(r: &mut Renderer, json: bool, ev: &TransferEvent) {
    if json {
        if let Ok(s) = serde_json::to_string(ev) {
            println!("{s}");
        }
        return;
    }
    let e = match ev.clone() {
        TransferEvent::Phase { phase } => ImageEvent::Phase { phase },
        TransferEvent::Progress { item, done, total } => ImageEvent::Progress { item, done, total },
        TransferEvent::Cached { item } => ImageEvent::Cached { item },
        TransferEvent::Log { line } => ImageEvent::Log { line },
        _ => return,
    };
    r.event(&e);
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

pub(crate) async fn push(
    c: &Client,
    id: &str,
    reference: String,
    a: RegistryArgs,
    json: bool,
) -> Result<()> {
    let req = PushSnapshot {
        reference,
        username: a.username,
        password: read_password(a.password)?,
        insecure: a.insecure,
        stream: true,
    };
    // The renderer prints JSON lines itself only for image events.
    let mut r = Renderer::new(false);
    let res = c.push_snapshot(id, &req, |e| show(&mut r, json, e)).await;
    r.finish();
    let p = res?;
    if json {
        return Ok(());
    }
    println!(
        "{}@{}",
        p.reference
            .rsplit_once(':')
            .map_or(p.reference.as_str(), |(r, _)| r),
        p.digest
    );
    eprintln!(
        "forkvm: pushed {} ({} link(s), {} already there; image {}): sent {} blobs, {}; skipped {} blobs, {} in {:.1} s",
        p.snapshot,
        p.links,
        p.links_skipped,
        if p.image_sent { "sent" } else { "already there" },
        p.blobs_sent,
        mib(p.bytes_sent),
        p.blobs_skipped,
        mib(p.bytes_skipped),
        p.total_ms as f64 / 1000.0
    );
    Ok(())
}

pub(crate) async fn pull(
    c: &Client,
    reference: String,
    tag: Option<String>,
    a: RegistryArgs,
    json: bool,
) -> Result<()> {
    let req = PullSnapshot {
        reference,
        tag,
        username: a.username,
        password: read_password(a.password)?,
        insecure: a.insecure,
        stream: true,
    };
    let mut r = Renderer::new(false);
    let res = c.pull_snapshot(&req, |e| show(&mut r, json, e)).await;
    r.finish();
    let p = res?;
    if json {
        return Ok(());
    }
    println!("{}", p.snapshot.id);
    eprintln!(
        "forkvm: pulled {} ({} link(s), {} already here; image {}{}): fetched {} blobs, {} in {:.1} s",
        p.snapshot.id,
        p.links,
        p.links_cached,
        p.image,
        if p.image_created { ", created" } else { "" },
        p.blobs_fetched,
        mib(p.bytes_fetched),
        p.total_ms as f64 / 1000.0
    );
    Ok(())
}
