//! One cgroup per sandbox QEMU, on cgroup v2 or v1.
//!
//! ```text
//!  v2 (unified hierarchy with controllers)   v1 (one tree per controller)
//!  <v2 root>/forkvm-<home hash>/<id>/        /sys/fs/cgroup/<ctrl>/forkvm-<home hash>/<id>/
//!                                            for ctrl in cpu,cpuacct memory pids blkio
//! ```
//!
//! v2 is used on a pure v2 host, and on a hybrid one whose `unified` tree
//! has the cpu, memory and pids controllers; otherwise the v1 controllers
//! that are mounted. Co-mounted v1 controllers
//! (`cpu,cpuacct`) are one directory, joined once.
//!
//! Today a cgroup only places QEMU (and so accounts it); [`Cgroup::set`]
//! is where limits go. The QEMU joins its cgroup itself before it execs
//! (see `forkvm_qemu::jail`), and the cgroup is removed once it has exited.

use std::io;
use std::path::{Path, PathBuf};

/// The v1 controllers a sandbox is placed under.
pub const V1_CONTROLLERS: &[&str] = &["cpu", "cpuacct", "memory", "pids", "blkio"];
/// The v2 controllers enabled for the sandboxes' parent, when available.
pub const V2_CONTROLLERS: &[&str] = &["cpu", "memory", "pids", "io"];

const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// How cgroups are laid out on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// The unified hierarchy mounted at `root`.
    V2 { root: PathBuf },
    /// Per-controller hierarchies: (controllers, mount directory), one
    /// entry per distinct mount.
    V1 { hierarchies: Vec<(String, PathBuf)> },
}

impl Layout {
    /// Detect the layout under `/sys/fs/cgroup`; `None` when neither has
    /// anything usable.
    pub fn detect() -> Option<Layout> {
        detect_at(Path::new("/sys/fs/cgroup"))
    }

    /// "v2 at …" or "v1 (cpu,cpuacct memory …)", for logs and doctor.
    pub fn describe(&self) -> String {
        match self {
            Layout::V2 { root } => format!("cgroup v2 at {}", root.display()),
            Layout::V1 { hierarchies } => format!(
                "cgroup v1 ({})",
                hierarchies
                    .iter()
                    .map(|(c, _)| c.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        }
    }
}

fn is_cgroup2(p: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs(2) on a NUL-terminated path into a zeroed struct we own.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == CGROUP2_SUPER_MAGIC
    }
}

fn v2_controllers(root: &Path) -> Vec<String> {
    std::fs::read_to_string(root.join("cgroup.controllers"))
        .map(|s| s.split_whitespace().map(String::from).collect())
        .unwrap_or_default()
}

fn detect_at(base: &Path) -> Option<Layout> {
    if is_cgroup2(base) {
        return Some(Layout::V2 { root: base.into() });
    }
    let unified = base.join("unified");
    // A hybrid host's unified tree often has a stray controller or none
    // (hugetlb only, here): it counts only with those limits will need.
    let have = v2_controllers(&unified);
    if is_cgroup2(&unified)
        && ["cpu", "memory", "pids"]
            .iter()
            .all(|c| have.iter().any(|h| h == c))
    {
        return Some(Layout::V2 { root: unified });
    }
    let mut hierarchies: Vec<(String, PathBuf)> = Vec::new();
    for c in V1_CONTROLLERS {
        let Ok(dir) = std::fs::canonicalize(base.join(c)) else {
            continue;
        };
        if !dir.join("cgroup.procs").exists() {
            continue;
        }
        match hierarchies.iter_mut().find(|(_, d)| *d == dir) {
            Some((names, _)) => {
                names.push(',');
                names.push_str(c);
            }
            None => hierarchies.push((c.to_string(), dir)),
        }
    }
    (!hierarchies.is_empty()).then_some(Layout::V1 { hierarchies })
}

/// One sandbox's cgroup: a directory per hierarchy (one on v2).
#[derive(Debug, Clone)]
pub struct Cgroup {
    dirs: Vec<(String, PathBuf)>,
}

impl Cgroup {
    /// The cgroup `<group>/<name>` under every hierarchy (not created).
    pub fn at(layout: &Layout, group: &str, name: &str) -> Cgroup {
        let dirs = match layout {
            Layout::V2 { root } => vec![(String::new(), root.join(group).join(name))],
            Layout::V1 { hierarchies } => hierarchies
                .iter()
                .map(|(c, d)| (c.clone(), d.join(group).join(name)))
                .collect(),
        };
        Cgroup { dirs }
    }

    /// Create `<group>/<name>` (and `<group>`, with the v2 controllers
    /// delegated to its children).
    pub fn create(layout: &Layout, group: &str, name: &str) -> io::Result<Cgroup> {
        if let Layout::V2 { root } = layout {
            let parent = root.join(group);
            std::fs::create_dir_all(&parent)?;
            // Best effort, one at a time: a controller the root does not
            // delegate is simply not there for limits later.
            for c in V2_CONTROLLERS {
                let _ = std::fs::write(parent.join("cgroup.subtree_control"), format!("+{c}"));
            }
        }
        let cg = Cgroup::at(layout, group, name);
        for (_, d) in &cg.dirs {
            std::fs::create_dir_all(d)?;
        }
        Ok(cg)
    }

    /// The `cgroup.procs` files a process writes itself into.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .map(|(_, d)| d.join("cgroup.procs"))
            .collect()
    }

    /// Move `pid` (all its threads) into the cgroup.
    pub fn add_pid(&self, pid: u32) -> io::Result<()> {
        for f in self.procs_files() {
            std::fs::write(f, pid.to_string())?;
        }
        Ok(())
    }

    /// Write a control file (`memory.max`, `cpu.cfs_quota_us`, …): on v1 in
    /// the hierarchy that has `controller`, on v2 in the one directory.
    pub fn set(&self, controller: &str, file: &str, value: &str) -> io::Result<()> {
        let dir = self
            .dirs
            .iter()
            .find(|(c, _)| c.is_empty() || c.split(',').any(|x| x == controller))
            .map(|(_, d)| d)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("no cgroup hierarchy has the {controller} controller"),
                )
            })?;
        std::fs::write(dir.join(file), value)
    }

    /// Is this the unified (v2) hierarchy? Its control files have other
    /// names than v1's (`cpu.max` for `cpu.cfs_quota_us`, …).
    pub fn is_v2(&self) -> bool {
        self.dirs.iter().any(|(c, _)| c.is_empty())
    }

    /// The directories, for tests and messages.
    pub fn dirs(&self) -> impl Iterator<Item = &Path> {
        self.dirs.iter().map(|(_, d)| d.as_path())
    }

    /// Remove the cgroup. Its processes must have exited; a missing
    /// directory is fine (already removed).
    pub fn remove(&self) -> io::Result<()> {
        let mut first = Ok(());
        for (_, d) in &self.dirs {
            match std::fs::remove_dir(d) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) if first.is_ok() => first = Err(e),
                Err(_) => {}
            }
        }
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_co_mounted_controllers_are_one_hierarchy() {
        let d = tempfile::tempdir().unwrap();
        let b = d.path();
        for c in ["cpu,cpuacct", "memory", "pids"] {
            std::fs::create_dir_all(b.join(c)).unwrap();
            std::fs::write(b.join(c).join("cgroup.procs"), "").unwrap();
        }
        std::os::unix::fs::symlink("cpu,cpuacct", b.join("cpu")).unwrap();
        std::os::unix::fs::symlink("cpu,cpuacct", b.join("cpuacct")).unwrap();
        let Some(Layout::V1 { hierarchies }) = detect_at(b) else {
            panic!("not v1")
        };
        let names: Vec<&str> = hierarchies.iter().map(|(c, _)| c.as_str()).collect();
        assert_eq!(names, ["cpu,cpuacct", "memory", "pids"]);
        let layout = Layout::V1 { hierarchies };
        assert!(layout.describe().contains("cpu,cpuacct memory pids"));
        let cg = Cgroup::create(&layout, "forkvm-x", "sb-1").unwrap();
        assert_eq!(cg.procs_files().len(), 3);
        cg.set("cpuacct", "cpu.shares", "10").unwrap();
        assert_eq!(
            std::fs::read_to_string(b.join("cpu,cpuacct/forkvm-x/sb-1/cpu.shares")).unwrap(),
            "10"
        );
        assert!(cg.set("blkio", "x", "1").is_err());
        std::fs::remove_file(b.join("cpu,cpuacct/forkvm-x/sb-1/cpu.shares")).unwrap();
        cg.remove().unwrap();
        assert!(!b.join("memory/forkvm-x/sb-1").exists());
        cg.remove().unwrap();
    }

    #[test]
    fn nothing_mounted_is_no_layout() {
        let d = tempfile::tempdir().unwrap();
        assert!(detect_at(d.path()).is_none());
    }
}
