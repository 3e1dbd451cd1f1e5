//! One cgroup per sandbox QEMU, on cgroup v2 or v1.
//!
//! ```text
//!  v2 (unified hierarchy with controllers)   v1 (one tree per controller)
//!  <v2 root><own>/forkvm-<home hash>/<id>/   /sys/fs/cgroup/<ctrl><own ctrl>/forkvm-<home hash>/<id>/
//!                                            for ctrl in cpu,cpuacct memory pids blkio
//! ```
//!
//! `<own>` is the daemon's own cgroup (from `/proc/self/cgroup`, per
//! hierarchy on v1), so a service manager that accounts for or stops the
//! daemon's cgroup (a systemd unit's) covers its QEMUs too; a daemon at the
//! root (a shell, a container) puts them at the root as before. On v2 a
//! cgroup that holds processes cannot hand controllers to its children (the
//! "no internal processes" rule): when the daemon is alone in its cgroup it
//! moves itself into a leaf `<own>/forkvm-daemon` (with systemd this needs
//! `Delegate=yes`), and when it cannot, its sandboxes stay at the root with
//! a warning, so that limits keep working.
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
    /// anything usable. (The hierarchies' roots: what `doctor` reports.)
    pub fn detect() -> Option<Layout> {
        detect_at(Path::new("/sys/fs/cgroup"))
    }

    /// The layout a daemon places its sandboxes in: [`Layout::detect`]'s,
    /// each root moved to the daemon's own cgroup (on v2, possibly moving
    /// the daemon into a leaf, see the module docs).
    pub fn for_daemon() -> Option<Layout> {
        let l = Layout::detect()?;
        let own =
            OwnCgroups::parse(&std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default());
        Some(match l.under(&own) {
            Layout::V2 { root } => Layout::V2 {
                root: v2_delegated(&l, root),
            },
            v1 => v1,
        })
    }

    /// The layout with every root moved to the daemon's cgroup in it.
    pub fn under(&self, own: &OwnCgroups) -> Layout {
        let join = |mount: &Path, own: &str| -> PathBuf {
            let rel = own.trim_start_matches('/');
            if rel.is_empty() {
                mount.to_path_buf()
            } else {
                mount.join(rel)
            }
        };
        match self {
            Layout::V2 { root } => Layout::V2 {
                root: join(root, own.v2.as_deref().unwrap_or("/")),
            },
            Layout::V1 { hierarchies } => Layout::V1 {
                hierarchies: hierarchies
                    .iter()
                    .map(|(names, d)| (names.clone(), join(d, own.v1_path(names))))
                    .collect(),
            },
        }
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

/// The daemon's own cgroup in each hierarchy, as `/proc/self/cgroup`
/// lists it (`ID:CONTROLLERS:PATH`; v2's line is `0::PATH`). A line that
/// does not parse, or a path that is not absolute or has `..`, counts as
/// the root: sandboxes then go where they went before.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnCgroups {
    pub v2: Option<String>,
    /// (controllers, path) per v1 hierarchy.
    pub v1: Vec<(Vec<String>, String)>,
}

/// The leaf a v2 daemon moves itself into (see the module docs).
pub const DAEMON_LEAF: &str = "forkvm-daemon";

impl OwnCgroups {
    pub fn parse(text: &str) -> OwnCgroups {
        let mut own = OwnCgroups::default();
        for line in text.lines() {
            let mut f = line.splitn(3, ':');
            let (Some(id), Some(ctrls), Some(path)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            let sane = id.parse::<u32>().is_ok()
                && path.starts_with('/')
                && !path.split('/').any(|c| c == ".." || c == ".")
                && !path.contains('\0');
            if !sane {
                continue;
            }
            // A daemon restarted inside the leaf a former one made counts
            // as its parent's, so that both find the same sandboxes.
            let path = match path.strip_suffix(DAEMON_LEAF) {
                Some(p) if p.ends_with('/') => match p.trim_end_matches('/') {
                    "" => "/",
                    p => p,
                },
                _ => path,
            };
            if ctrls.is_empty() {
                if id == "0" {
                    own.v2 = Some(path.to_string());
                }
            } else {
                own.v1.push((
                    ctrls.split(',').map(String::from).collect(),
                    path.to_string(),
                ));
            }
        }
        own
    }

    /// The path of the v1 hierarchy holding `names` (`cpu,cpuacct`); `/`
    /// when none is listed.
    fn v1_path(&self, names: &str) -> &str {
        self.v1
            .iter()
            .find(|(c, _)| names.split(',').any(|n| c.iter().any(|x| x == n)))
            .map_or("/", |(_, p)| p.as_str())
    }
}

/// The v2 directory sandboxes go under: `own` if the controllers limits
/// need can be enabled for its children (moving the daemon into a leaf if
/// it is alone there), else the hierarchy's root (`full`'s).
fn v2_delegated(full: &Layout, own: PathBuf) -> PathBuf {
    let Layout::V2 { root } = full else {
        return own;
    };
    if own == *root {
        return own;
    }
    let enabled = |d: &Path| {
        for c in V2_CONTROLLERS {
            let _ = std::fs::write(d.join("cgroup.subtree_control"), format!("+{c}"));
        }
        let have = std::fs::read_to_string(d.join("cgroup.subtree_control")).unwrap_or_default();
        ["cpu", "memory", "pids"]
            .iter()
            .all(|c| have.split_whitespace().any(|h| h == *c))
    };
    if enabled(&own) {
        return own;
    }
    let me = std::process::id().to_string();
    let procs = std::fs::read_to_string(own.join("cgroup.procs")).unwrap_or_default();
    if procs.split_whitespace().all(|p| p == me) {
        let leaf = own.join(DAEMON_LEAF);
        let moved = std::fs::create_dir_all(&leaf)
            .and_then(|()| std::fs::write(leaf.join("cgroup.procs"), &me));
        if moved.is_ok() && enabled(&own) {
            tracing::info!(
                "moved the daemon into {} so that its sandboxes' cgroups can have controllers",
                leaf.display()
            );
            return own;
        }
    }
    tracing::warn!(
        "the daemon's cgroup {} cannot give its sandboxes the cpu, memory and pids controllers \
         (other processes are in it, or they are not delegated to it): sandbox cgroups go under \
         {} instead; run the daemon in a cgroup of its own (systemd: Delegate=yes)",
        own.display(),
        root.display()
    );
    root.clone()
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
    fn sandboxes_go_under_the_daemons_own_cgroup_in_each_hierarchy() {
        // A hybrid host, as in a systemd unit (v1 co-mounted cpu,cpuacct).
        let text = "12:pids:/system.slice/forkvm.service\n\
                    5:cpu,cpuacct:/system.slice/forkvm.service\n\
                    4:memory:/system.slice/forkvm.service\n\
                    3:blkio:/\n\
                    1:name=systemd:/system.slice/forkvm.service\n\
                    0::/system.slice/forkvm.service\n";
        let own = OwnCgroups::parse(text);
        assert_eq!(own.v2.as_deref(), Some("/system.slice/forkvm.service"));
        let v1 = Layout::V1 {
            hierarchies: vec![
                ("cpu,cpuacct".into(), "/cg/cpu,cpuacct".into()),
                ("memory".into(), "/cg/memory".into()),
                ("pids".into(), "/cg/pids".into()),
                ("blkio".into(), "/cg/blkio".into()),
            ],
        };
        let Layout::V1 { hierarchies } = v1.under(&own) else {
            panic!()
        };
        let dirs: Vec<&str> = hierarchies
            .iter()
            .map(|(_, d)| d.to_str().unwrap())
            .collect();
        assert_eq!(
            dirs,
            [
                "/cg/cpu,cpuacct/system.slice/forkvm.service",
                "/cg/memory/system.slice/forkvm.service",
                "/cg/pids/system.slice/forkvm.service",
                "/cg/blkio",
            ]
        );
        let cg = Cgroup::at(&Layout::V1 { hierarchies }, "forkvm-h", "sb-1");
        assert_eq!(
            cg.dirs().next().unwrap(),
            Path::new("/cg/cpu,cpuacct/system.slice/forkvm.service/forkvm-h/sb-1")
        );
        // Pure v2, and a daemon restarted in the leaf a former one made.
        let v2 = Layout::V2 {
            root: "/sys/fs/cgroup".into(),
        };
        for text in [
            "0::/a.slice/b.service\n",
            "0::/a.slice/b.service/forkvm-daemon\n",
        ] {
            assert_eq!(
                v2.under(&OwnCgroups::parse(text)),
                Layout::V2 {
                    root: "/sys/fs/cgroup/a.slice/b.service".into()
                },
                "{text}"
            );
        }
        // At the root: where sandboxes always went.
        assert_eq!(v2.under(&OwnCgroups::parse("0::/\n")), v2);
        assert_eq!(v2.under(&OwnCgroups::parse("0::/forkvm-daemon\n")), v2);
        assert_eq!(v1.under(&OwnCgroups::parse("4:memory:/\n0::/\n")), v1);
    }

    #[test]
    fn a_corrupt_proc_self_cgroup_counts_as_the_root() {
        let v2 = Layout::V2 {
            root: "/sys/fs/cgroup".into(),
        };
        let v1 = Layout::V1 {
            hierarchies: vec![("memory".into(), "/cg/memory".into())],
        };
        for text in [
            "",
            "garbage",
            "0::relative/path",
            "0::/a/../../etc",
            "x::/a",
            "0:/a",
            "4:memory:/a/./b\n0::/../x",
            "\u{0}\n::\n:::",
        ] {
            let own = OwnCgroups::parse(text);
            assert_eq!(v2.under(&own), v2, "{text:?}");
            assert_eq!(v1.under(&own), v1, "{text:?}");
        }
        // A named v1 hierarchy (name=systemd) is not a controller.
        let own = OwnCgroups::parse("1:name=systemd:/x\n");
        assert_eq!(v1.under(&own), v1);
    }

    #[test]
    fn nothing_mounted_is_no_layout() {
        let d = tempfile::tempdir().unwrap();
        assert!(detect_at(d.path()).is_none());
    }
}
