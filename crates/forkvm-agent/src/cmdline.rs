//! Pure parsing: the kernel command line and `/etc/forkvm/modules.list`.

/// Root device used when `forkvm.root=` is absent.
pub const DEFAULT_ROOT: &str = "/dev/vda";

/// The `forkvm.*` parameters the agent understands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootParams {
    /// `forkvm.root=`: block device holding the ext4 root filesystem.
    pub root: String,
    /// `forkvm.hostname=`: hostname to set in stage 2.
    pub hostname: Option<String>,
    /// `forkvm.probe=1`: print `FORKVM_PROBE_OK` and power off.
    pub probe: bool,
    /// `forkvm.ip=A.B.C.D/P`: the address of the first NIC (`eth0`).
    pub ip: Option<(std::net::Ipv4Addr, u8)>,
    /// `forkvm.gw=A.B.C.D`: the default gateway.
    pub gw: Option<std::net::Ipv4Addr>,
    /// `forkvm.dns=A.B.C.D`: the nameserver written to /etc/resolv.conf.
    pub dns: Option<std::net::Ipv4Addr>,
}

/// Split a kernel command line into parameters the way the kernel does:
/// whitespace separates them, and double quotes group a value containing
/// spaces (`foo="a b"`); the quote characters themselves are dropped.
pub fn split_cmdline(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_token = false;
    let mut in_quote = false;
    for c in s.chars() {
        match c {
            '"' => {
                in_quote = !in_quote;
                in_token = true;
            }
            c if c.is_whitespace() && !in_quote => {
                if in_token {
                    out.push(std::mem::take(&mut cur));
                    in_token = false;
                }
            }
            c => {
                cur.push(c);
                in_token = true;
            }
        }
    }
    if in_token {
        out.push(cur);
    }
    out
}

/// Extract the `forkvm.*` parameters. As with the kernel, the last
/// occurrence of a parameter wins.
pub fn boot_params(tokens: &[String]) -> BootParams {
    let mut p = BootParams {
        root: DEFAULT_ROOT.to_string(),
        hostname: None,
        probe: false,
        ip: None,
        gw: None,
        dns: None,
    };
    for t in tokens {
        let (key, value) = match t.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (t.as_str(), None),
        };
        match key {
            "forkvm.root" => {
                p.root = match value {
                    Some(v) if !v.is_empty() => v.to_string(),
                    _ => DEFAULT_ROOT.to_string(),
                }
            }
            "forkvm.hostname" => p.hostname = value.filter(|v| !v.is_empty()).map(str::to_string),
            // A bare `forkvm.probe` counts as on, like kernel boolean params.
            "forkvm.probe" => {
                p.probe = matches!(value, None | Some("1" | "y" | "yes" | "on" | "true"))
            }
            "forkvm.ip" => {
                p.ip = value.and_then(|v| {
                    let (a, n) = v.split_once('/')?;
                    let n: u8 = n.parse().ok().filter(|n| *n <= 32)?;
                    Some((a.parse().ok()?, n))
                })
            }
            "forkvm.gw" => p.gw = value.and_then(|v| v.parse().ok()),
            "forkvm.dns" => p.dns = value.and_then(|v| v.parse().ok()),
            _ => {}
        }
    }
    p
}

/// The module name the kernel uses for a `.ko` file: the file name without
/// directory and `.ko[.xz|.zst|.gz]`, with `-` normalised to `_`.
pub fn module_name(file: &str) -> String {
    let base = file.rsplit('/').next().unwrap_or(file);
    let stem = base.split(".ko").next().unwrap_or(base);
    stem.replace('-', "_")
}

/// Parameters for module `module` given on the kernel command line as
/// `module.param=value`, joined into the string `finit_module` expects.
///
/// For built-in code the kernel applies these itself, but for loadable
/// modules it is userspace's job (modprobe normally does it). This matters
/// for e.g. `virtio_mmio.device=...`, which QEMU's `microvm` machine appends
/// to describe its virtio-mmio transports.
pub fn module_params(tokens: &[String], module: &str) -> String {
    let mut params = Vec::new();
    for t in tokens {
        let (key, value) = match t.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (t.as_str(), None),
        };
        let Some((m, param)) = key.split_once('.') else {
            continue;
        };
        if param.is_empty() || m.replace('-', "_") != module {
            continue;
        }
        params.push(match value {
            Some(v) if v.chars().any(char::is_whitespace) => format!("{param}=\"{v}\""),
            Some(v) => format!("{param}={v}"),
            None => param.to_string(),
        });
    }
    params.join(" ")
}

/// Parse `modules.list`: one `.ko` file name per line, in load order. Blank
/// lines are skipped and `#` starts a comment (whole-line or trailing).
pub fn parse_modules_list(s: &str) -> Vec<String> {
    s.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<String> {
        split_cmdline(s)
    }

    #[test]
    fn splits_on_whitespace_and_honours_quotes() {
        assert_eq!(
            toks("  console=ttyS0 panic=1\tquiet\nfoo=\"a b\" \"x y\"=z "),
            vec!["console=ttyS0", "panic=1", "quiet", "foo=a b", "x y=z"]
        );
        assert!(toks("").is_empty());
        assert!(toks("   \n").is_empty());
        assert_eq!(toks("a=\"\""), vec!["a="]);
    }

    #[test]
    fn boot_params_defaults() {
        let p = boot_params(&toks("console=ttyS0 panic=1 quiet"));
        assert_eq!(
            p,
            BootParams {
                root: "/dev/vda".into(),
                hostname: None,
                probe: false,
                ip: None,
                gw: None,
                dns: None,
            }
        );
    }

    #[test]
    fn boot_params_from_host_cmdline() {
        let p = boot_params(&toks(
            "console=ttyS0 panic=1 quiet loglevel=4 8250.nr_uarts=1 random.trust_cpu=on \
             forkvm.root=/dev/vdb forkvm.hostname=sb-abc123 forkvm.probe=1",
        ));
        assert_eq!(p.root, "/dev/vdb");
        assert_eq!(p.hostname.as_deref(), Some("sb-abc123"));
        assert!(p.probe);
    }

    #[test]
    fn boot_params_edge_cases() {
        assert!(boot_params(&toks("forkvm.probe")).probe);
        assert!(!boot_params(&toks("forkvm.probe=0")).probe);
        assert!(!boot_params(&toks("forkvm.probe=1 forkvm.probe=0")).probe);
        assert_eq!(boot_params(&toks("forkvm.root=")).root, DEFAULT_ROOT);
        assert_eq!(boot_params(&toks("forkvm.hostname=")).hostname, None);
        let n = boot_params(&toks(
            "forkvm.ip=172.16.0.2/30 forkvm.gw=172.16.0.1 forkvm.dns=10.0.0.53",
        ));
        assert_eq!(n.ip, Some(("172.16.0.2".parse().unwrap(), 30)));
        assert_eq!(n.gw, Some("172.16.0.1".parse().unwrap()));
        assert_eq!(n.dns, Some("10.0.0.53".parse().unwrap()));
        // Malformed network parameters are ignored, not half-applied.
        for bad in [
            "forkvm.ip=172.16.0.2",
            "forkvm.ip=172.16.0.2/33",
            "forkvm.ip=x/24",
            "forkvm.ip",
        ] {
            assert_eq!(boot_params(&toks(bad)).ip, None, "{bad}");
        }
        assert_eq!(boot_params(&toks("forkvm.gw=nope")).gw, None);
        // Other prefixes do not match.
        assert!(!boot_params(&toks("xforkvm.probe=1 forkvm.probex=1")).probe);
    }

    #[test]
    fn module_names() {
        assert_eq!(module_name("virtio_mmio.ko"), "virtio_mmio");
        assert_eq!(module_name("/lib/modules/crc32c-intel.ko"), "crc32c_intel");
        assert_eq!(module_name("ext4.ko.xz"), "ext4");
        assert_eq!(module_name("noext"), "noext");
    }

    #[test]
    fn module_params_are_collected_from_cmdline() {
        let t = toks(
            "console=ttyS0 virtio_mmio.device=512@0xfeb00e00:12 \
             virtio_mmio.device=512@0xfeb00c00:11 virtio-blk.queue_depth=4 \
             foo.bar=\"x y\" foo.flag ext4 virtio_mmio.=bad",
        );
        assert_eq!(
            module_params(&t, "virtio_mmio"),
            "device=512@0xfeb00e00:12 device=512@0xfeb00c00:11"
        );
        assert_eq!(module_params(&t, "virtio_blk"), "queue_depth=4");
        assert_eq!(module_params(&t, "foo"), "bar=\"x y\" flag");
        assert_eq!(module_params(&t, "ext4"), "");
    }

    #[test]
    fn modules_list_parsing() {
        let s = "# load order\n\nvirtio.ko\n  virtio_ring.ko  \nvirtio_mmio.ko # transport\n#ext4.ko\n\r\n";
        assert_eq!(
            parse_modules_list(s),
            vec!["virtio.ko", "virtio_ring.ko", "virtio_mmio.ko"]
        );
        assert!(parse_modules_list("").is_empty());
    }
}
