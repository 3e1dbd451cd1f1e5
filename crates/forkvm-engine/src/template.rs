//! Boot templates: the first spawn of an image shape cold-boots and
//! snapshots it, and every later spawn is a copy-on-write clone of that.

use std::sync::Arc;
use std::time::{Duration, Instant};

use forkvm_api::Sandbox;

use crate::error::EngineError;
use crate::images::BootReq;
use crate::manager::Manager;
use crate::util::ms;

/// The key of an image's boot template: the image, the machine shape and the
/// identity (size and mtime) of every boot artefact, so that rebuilding the
/// kernel, initramfs or image makes a new template instead of reusing one
/// that no longer matches.
pub fn template_key(m: &Manager, boot: &crate::images::BootReq) -> String {
    use std::os::unix::fs::MetadataExt;
    let (image, memory_mib, cpus) = (boot.image.as_str(), boot.memory_mib, boot.cpus);
    // Whether sandboxes get a NIC is part of the machine: a template made
    // without one cannot give its clones a network. The disk size and the
    // image's metadata (its start command) shape the template too, and so
    // does the volume port (templates from before it cannot mount volumes).
    let mut s = format!(
        "{image}|{memory_mib}|{cpus}|{}|nic={}|disk={:?}|volume-port",
        m.accel.accel,
        m.net.available(),
        boot.disk_size
    );
    for p in [
        m.cfg.kernel(),
        m.cfg.initrd(),
        m.cfg.image_rootfs(image),
        m.cfg.images_dir().join(image).join("image.json"),
    ] {
        let (len, mtime) = std::fs::metadata(&p)
            .map(|md| (md.len(), md.mtime_nsec() + md.mtime() * 1_000_000_000))
            .unwrap_or((0, 0));
        s.push_str(&format!("|{len}:{mtime}"));
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{image}-{memory_mib}m-{cpus}c-{h:016x}")
}

impl Manager {
    /// Spawn from the image's boot template, creating it from a cold boot the
    /// first time.
    pub async fn spawn_via_template(
        self: &Arc<Self>,
        boot: &BootReq,
        n: u32,
        net: &crate::net::NetRequest,
    ) -> Result<Vec<Sandbox>, EngineError> {
        let image = boot.image.as_str();
        let key = crate::template::template_key(self, boot);
        if let Some(t) = self.db.snapshot_by_template(&key)? {
            match self.open_verified(&t.id).await {
                Ok(snap) => return self.spawn_clones(&snap, n, net).await,
                Err(e) => {
                    // A broken template is replaced, not fatal.
                    tracing::warn!(
                        "boot template {} is unusable ({}); making a new one",
                        t.id,
                        e.message
                    );
                    let _ = self.db.delete_snapshot(&t.id);
                }
            }
        }
        let claimed = self
            .templating
            .lock()
            .map(|mut s| s.insert(key.clone()))
            .unwrap_or(false);
        if !claimed {
            // Someone else is making this template: wait for it, then clone
            // it, so every default sandbox is a clone (diff-capable, sharing
            // its pages) whoever asked first.
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(300)
                && self
                    .templating
                    .lock()
                    .map(|s| s.contains(&key))
                    .unwrap_or(false)
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if let Some(t) = self.db.snapshot_by_template(&key)? {
                if let Ok(snap) = self.open_verified(&t.id).await {
                    return self.spawn_clones(&snap, n, net).await;
                }
            }
            let mut v = Vec::new();
            for _ in 0..n {
                v.push(self.cold_boot(boot, net).await?);
            }
            return Ok(v);
        }
        // The template's source only makes the template: it needs a NIC
        // (so its clones have one) but no way out.
        let first = match self.cold_boot(boot, &crate::net::NetRequest::none()).await {
            Ok(f) => f,
            Err(e) => {
                if let Ok(mut s) = self.templating.lock() {
                    s.remove(&key);
                }
                return Err(e);
            }
        };
        let t = Instant::now();
        let made = self
            .snapshot(
                &first.id,
                None,
                Some(key.clone()),
                crate::snapshot::Save::Stopped,
            )
            .await;
        if let Ok(mut s) = self.templating.lock() {
            s.remove(&key);
        }
        let template_ms = ms(t.elapsed());
        let clones = match made {
            Ok(snap) => {
                // The booted sandbox only made the template: every sandbox
                // handed out is a clone of it, so they all share its pages
                // and can all be branched in `diff` mode.
                match self.open_verified(&snap.id).await {
                    Ok(s) => self.spawn_clones(&s, n, net).await,
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        match clones {
            Ok(mut v) => {
                if let Err(e) = self.remove(&first.id).await {
                    tracing::warn!(
                        "could not remove template source {}: {}",
                        first.id,
                        e.message
                    );
                }
                if let (Some(c), Some(b)) = (
                    v.first_mut().and_then(|c| c.timings.as_mut()),
                    first.timings.as_ref(),
                ) {
                    c.boot_ms = b.boot_ms;
                    c.template_ms = Some(template_ms);
                    c.total_ms += b.total_ms + template_ms;
                }
                Ok(v)
            }
            Err(e) => {
                tracing::warn!("could not make the boot template of {image}: {}", e.message);
                // The template failed: hand out its source, with the network
                // the caller asked for, and cold boots for the rest.
                if let Err(e) = self.connect_booted(&first.id, net).await {
                    let _ = self.remove(&first.id).await;
                    return Err(e);
                }
                let first = self.get(&first.id)?;
                let mut v = vec![first];
                for _ in 1..n {
                    v.push(self.cold_boot(boot, net).await?);
                }
                Ok(v)
            }
        }
    }
}
