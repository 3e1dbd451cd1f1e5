//! Files and directories as a guest user: what E2B's envd API needs (its
//! files belong to the user who writes them) and any front-end may call.
//!
//! A file is written as a one-entry tar that the agent unpacks as `user`
//! (so its owner and the checks are the user's); a directory is made by
//! `mkdir -p` run as that user, so every directory it creates is theirs.

use std::time::Duration;

use forkvm_api::{DirMade, ExecRequest};

use crate::error::{agent_error, EngineError, ErrorKind};
use crate::manager::Manager;

/// How long an upload of one file to the agent may take.
const PUT_DEADLINE: Duration = Duration::from_secs(300);

/// True for no user, or root by name or uid.
pub fn is_root(user: Option<&str>) -> bool {
    user.is_none_or(|u| matches!(u.split(':').next(), Some("root" | "0" | "")))
}

impl Manager {
    /// Write one whole file owned by `user` (root when none), with mode
    /// 0644, replacing what was there.
    pub async fn write_file_as(
        &self,
        id: &str,
        path: &str,
        data: &[u8],
        user: Option<&str>,
    ) -> Result<(), EngineError> {
        let (dir, name) = match path.rsplit_once('/') {
            Some((d, n)) if !n.is_empty() => (if d.is_empty() { "/" } else { d }, n),
            _ => {
                return Err(EngineError::invalid(format!(
                    "{path:?} does not name a file"
                )))
            }
        };
        if data.len() as u64 > self.cfg.limits.max_file_bytes {
            return Err(EngineError::new(
                ErrorKind::TooLarge,
                format!(
                    "{path} is {} bytes, over the limit of {}",
                    data.len(),
                    self.cfg.limits.max_file_bytes
                ),
            ));
        }
        let tar = one_file_tar(name, data).map_err(|e| EngineError::internal(e.to_string()))?;
        let agent = self.guest_agent(id).await?;
        agent
            .put_archive(dir, user, &tar, PUT_DEADLINE)
            .await
            .map_err(|e| agent_error(id, e))?;
        Ok(())
    }

    /// `mkdir -p` as `user`. `existed` is true when the directory was there
    /// already (nothing is changed then).
    pub async fn make_dir_as(
        &self,
        id: &str,
        path: &str,
        user: Option<&str>,
    ) -> Result<DirMade, EngineError> {
        if is_root(user) {
            return self.make_dir(id, path).await;
        }
        match self.stat_file(id, path).await {
            Ok(entry) => {
                return Ok(DirMade {
                    entry,
                    existed: true,
                })
            }
            Err(e) if e.kind == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let run = ExecRequest {
            argv: vec!["mkdir".into(), "-p".into(), "--".into(), path.to_string()],
            user: user.map(String::from),
            timeout_ms: Some(30_000),
            ..Default::default()
        };
        let r = self.exec(id, run).await?;
        if r.exit_code != Some(0) {
            return Err(EngineError::new(
                ErrorKind::Forbidden,
                format!("cannot make directory {path}: {}", r.stderr.trim()),
            ));
        }
        Ok(DirMade {
            entry: self.stat_file(id, path).await?,
            existed: false,
        })
    }
}

/// A tar holding one regular file `name`, owned by root with mode 0644 (the
/// agent gives it to the user it unpacks as).
fn one_file_tar(name: &str, data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    h.set_mtime(now);
    let mut b = tar::Builder::new(Vec::new());
    b.append_data(&mut h, name, data)?;
    b.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn one_file_tar_holds_the_file() {
        let t = one_file_tar("x.txt", b"abc").unwrap();
        let mut a = tar::Archive::new(&t[..]);
        let mut e = a.entries().unwrap().next().unwrap().unwrap();
        assert_eq!(e.path().unwrap().to_str(), Some("x.txt"));
        assert_eq!(e.header().mode().unwrap(), 0o644);
        let mut s = String::new();
        e.read_to_string(&mut s).unwrap();
        assert_eq!(s, "abc");
    }

    #[test]
    fn root_is_named_or_numbered() {
        assert!(is_root(None));
        assert!(is_root(Some("root")));
        assert!(is_root(Some("0:0")));
        assert!(!is_root(Some("user")));
        assert!(!is_root(Some("1000")));
    }
}
