#!/usr/bin/env bash
# Build the forkvm guest artefacts under the data dir:
#
#   $FORKVM_HOME/guest/vmlinux                 ELF kernel (PVH boot), from Debian's
#                                              bookworm-backports linux-image-amd64
#   $FORKVM_HOME/guest/kernel.release          e.g. 6.12.95+deb12-amd64
#   $FORKVM_HOME/guest/initramfs.img           gzip'd newc cpio: /init = forkvm-agent,
#                                              virtio/ext4 modules, /etc/forkvm/modules.list
#   $FORKVM_HOME/images/default/rootfs.ext4    default image (Debian bookworm + python3, git, sudo), 0444
#   $FORKVM_HOME/images/default/image.json     its metadata
#
# Each artefact is rebuilt only when missing or when its inputs changed: a stamp
# file next to it (.vmlinux.stamp, .initramfs.stamp, .rootfs.stamp) holds the
# sha256 of its inputs. Artefacts are written under a temporary name in the same
# directory and renamed into place, so an interrupted build never leaves a
# half-written artefact under its final name. Downloads are kept in
# $FORKVM_HOME/cache/.
#
# Usage: sudo scripts/build-guest.sh [--force]
#   --force    rebuild every artefact (the downloaded kernel .deb is reused)
# Environment:
#   FORKVM_HOME=/var/lib/forkvm   data dir
#   FORKVM_SKIP_IMAGE=1           skip the default rootfs image (the slow part:
#                                 mmdebstrap takes 1-3 minutes); handy for quick
#                                 testing of the kernel/initramfs/agent
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$SCRIPT_DIR/lib.sh"

FORCE=0
for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument: $arg" "Usage: scripts/build-guest.sh [--force]" ;;
    esac
done

# Bump a recipe version to force a rebuild of that artefact everywhere.
KERNEL_RECIPE=1
INITRAMFS_RECIPE=2
IMAGE_RECIPE=1

GUEST_TARGET=x86_64-unknown-linux-gnu
# Modules for the initramfs, in the order wanted; dependencies are resolved
# from modules.dep and loaded first. crc32c_generic provides the crc32c
# checksum driver ext4 needs (a soft dependency, hence listed explicitly).
# virtio_console and vmgenid are built into the Debian kernel.
INITRAMFS_MODULES=(virtio_mmio virtio_blk virtio_net crc32c_generic ext4)
INITRAMFS_DIRS=(proc sys dev newroot tmp)

IMAGE_SUITE=bookworm
IMAGE_VARIANT=minbase
# git, sudo and python-is-python3 (`python`): what E2B's base template has
# and agent code assumes; examples/e2b-base builds on this image (docs/e2b.md).
IMAGE_PKGS=(python3 python-is-python3 git sudo iproute2 procps ca-certificates curl iputils-ping iperf3)
IMAGE_SIZE=2G
IMAGE_DESCRIPTION="Debian bookworm with python3, git and sudo"

FORKVM_HOME=${FORKVM_HOME:-/var/lib/forkvm}
GUEST_DIR=$FORKVM_HOME/guest
IMAGE_DIR=$FORKVM_HOME/images/default
CACHE_DIR=$FORKVM_HOME/cache
LOG_DIR=$FORKVM_HOME/logs

VMLINUX=$GUEST_DIR/vmlinux
KRELEASE_FILE=$GUEST_DIR/kernel.release
INITRAMFS=$GUEST_DIR/initramfs.img
ROOTFS=$IMAGE_DIR/rootfs.ext4
IMAGE_JSON=$IMAGE_DIR/image.json
AGENT_BIN=$REPO/target/guest/$GUEST_TARGET/release/forkvm-agent

T_START=$(now)
export DEBIAN_FRONTEND=noninteractive
require_root scripts/build-guest.sh
ensure_cargo_path

# --- temp files: removed on any exit ------------------------------------------------
CLEANUP=()
cleanup() {
    local p mnt
    kill_run_long
    for p in "${CLEANUP[@]}"; do
        [[ -e "$p" || -L "$p" ]] || continue
        # Never follow a leftover mount out of a temp tree (mmdebstrap runs in
        # its own mount namespace, so there should be none).
        while read -r mnt; do
            umount -l "$mnt" 2>/dev/null || true
        done < <(awk -v p="$p/" 'index($5 "/", p) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
        rm -rf --one-file-system -- "$p"
    done
}
trap cleanup EXIT

mkdir -p "$GUEST_DIR" "$IMAGE_DIR" "$CACHE_DIR" "$LOG_DIR"
chmod 0755 "$FORKVM_HOME" "$FORKVM_HOME/images" "$GUEST_DIR" "$IMAGE_DIR" "$CACHE_DIR"

exec 9>"$FORKVM_HOME/.build.lock"
if ! flock -n 9; then
    log "another build-guest.sh is running on $FORKVM_HOME; waiting for it..."
    flock 9
fi
# Leftovers of a killed run (we hold the lock, so nobody else is using them).
for p in "$GUEST_DIR"/*.tmp.* "$GUEST_DIR"/.*.tmp.* "$GUEST_DIR"/.initramfs.stage.* \
         "$IMAGE_DIR"/*.tmp.* "$IMAGE_DIR"/.*.tmp.* "$IMAGE_DIR"/.rootfs.build.* \
         "$CACHE_DIR"/.download.* "$CACHE_DIR"/.kernel.unpack.*; do
    [[ -e "$p" ]] && CLEANUP+=("$p")
done
cleanup
CLEANUP=()

# --- kernel package -------------------------------------------------------------------

KPKG='' KVER='' KRELEASE='' KDEB=''

# Find the kernel package that bookworm-backports' linux-image-amd64 depends on
# and its version. The answer is cached against the apt index files, which
# keeps no-op runs fast (apt-cache takes ~1s).
resolve_kernel() {
    local -a lists=()
    local fp cachef="$CACHE_DIR/kernel.resolved" out dep
    mapfile -t lists < <(compgen -G '/var/lib/apt/lists/*_dists_bookworm-backports_*' || true)
    if (( ${#lists[@]} == 0 )); then
        return 1
    fi
    fp=$({ stat -c '%n %s %Y' "${lists[@]}" /etc/apt/preferences /etc/apt/preferences.d/* 2>/dev/null ||
           true; } | sha256sum | cut -d' ' -f1)
    if [[ -f "$cachef" ]] && { read -r f_fp; read -r KPKG; read -r KVER; } <"$cachef" &&
        [[ "$f_fp" == "$fp" && -n "$KPKG" && -n "$KVER" ]]; then
        :
    else
        out=$(apt-cache show --no-all-versions -t bookworm-backports linux-image-amd64 2>/dev/null) || return 1
        dep=$(sed -n 's/^Depends: //p' <<<"$out" | head -n 1)
        KPKG=$(grep -oE 'linux-image-[0-9][^ ,]*' <<<"$dep" | head -n 1 || true)
        KVER=$(sed -n "s/.*${KPKG} (= \([^)]*\)).*/\1/p" <<<"$dep")
        [[ -n "$KPKG" ]] || return 1
        if [[ -z "$KVER" ]]; then
            KVER=$(apt-cache -t bookworm-backports policy "$KPKG" | sed -n 's/^ *Candidate: //p')
        fi
        [[ -n "$KVER" && "$KVER" != "(none)" && "$KVER" == *bpo* ]] || return 1
        printf '%s\n%s\n%s\n' "$fp" "$KPKG" "$KVER" >"$cachef.tmp.$$"
        mv -f "$cachef.tmp.$$" "$cachef"
    fi
    KRELEASE=${KPKG#linux-image-}
    KDEB=$CACHE_DIR/${KPKG}_${KVER//:/%3a}_amd64.deb
}

download_kernel() {
    [[ -s "$KDEB" ]] && return 0
    local dl
    dl=$(mktemp -d "$CACHE_DIR/.download.XXXXXX")
    CLEANUP+=("$dl")
    # Let apt's sandbox user write there (else apt warns and downloads as root).
    chmod 0755 "$dl"
    chown _apt "$dl" 2>/dev/null || true
    info "downloading $KPKG $KVER (~100 MB) into $CACHE_DIR"
    (cd "$dl" && apt-get download -q "$KPKG=$KVER") || return 1
    local -a debs=("$dl"/*.deb)
    [[ -s "${debs[0]}" ]] || return 1
    mv -f "${debs[0]}" "$KDEB"
    chown root: "$KDEB"
    # Drop the kernels of earlier runs.
    find "$CACHE_DIR" -maxdepth 1 -name 'linux-image-*.deb' ! -path "$KDEB" -delete
}

KTREE=''
# Unpack the kernel package (not installed on the host) into a temp dir.
# Sets KTREE.
unpack_kernel() {
    [[ -n "$KTREE" ]] && return 0
    KTREE=$(mktemp -d "$CACHE_DIR/.kernel.unpack.XXXXXX")
    CLEANUP+=("$KTREE")
    dpkg-deb -x "$KDEB" "$KTREE"
    [[ -f "$KTREE/boot/vmlinuz-$KRELEASE" ]] ||
        die "$KDEB has no boot/vmlinuz-$KRELEASE." "Delete it and re-run scripts/build-guest.sh."
    if [[ ! -d "$KTREE/lib/modules/$KRELEASE" && -d "$KTREE/usr/lib/modules/$KRELEASE" ]]; then
        ln -s usr/lib "$KTREE/lib"
    fi
    [[ -d "$KTREE/lib/modules/$KRELEASE" ]] ||
        die "$KDEB has no modules for $KRELEASE." "Delete it and re-run scripts/build-guest.sh."
}

step "Kernel package (bookworm-backports linux-image-amd64)"
FAIL_HINT="Check access to the Debian mirror and that bookworm-backports is configured (run scripts/setup.sh)."
KERNEL_OK=1
if ! resolve_kernel; then
    if [[ -s "$VMLINUX" && -s "$KRELEASE_FILE" && -s "$INITRAMFS" && $FORCE -eq 0 ]]; then
        warn "cannot look up linux-image-amd64 in bookworm-backports (apt lists missing?); keeping the existing kernel."
        KERNEL_OK=0
    else
        die "cannot find linux-image-amd64 in bookworm-backports in the apt lists." \
            "Run scripts/setup.sh (it configures bookworm-backports), or: apt-get update"
    fi
fi
if (( KERNEL_OK )); then
    KERNEL_HASH=$(inputs_hash "kernel-recipe=$KERNEL_RECIPE" "$KPKG" "$KVER")
    if [[ -s "$KDEB" ]]; then
        step_skip "$KPKG $KVER"
    else
        if ! download_kernel; then
            warn "download failed; the apt lists may be stale, running apt-get update and retrying"
            run_long "$LOG_DIR/apt-update.log" apt-get update -q
            rm -f "$CACHE_DIR/kernel.resolved"
            resolve_kernel || die "cannot find linux-image-amd64 in bookworm-backports after apt-get update."
            KERNEL_HASH=$(inputs_hash "kernel-recipe=$KERNEL_RECIPE" "$KPKG" "$KVER")
            download_kernel || die "apt-get download $KPKG=$KVER failed." \
                "Check access to the Debian mirror and re-run scripts/build-guest.sh."
        fi
        step_done "$KPKG $KVER"
    fi
else
    KRELEASE=$(cat "$KRELEASE_FILE")
    KERNEL_HASH=$(cat "$GUEST_DIR/.vmlinux.stamp" 2>/dev/null || echo unknown)
fi

# --- a) vmlinux --------------------------------------------------------------------------
step "Kernel: $VMLINUX"
FAIL_HINT="Re-run scripts/build-guest.sh --force; if it fails again, delete $CACHE_DIR/linux-image-*.deb."
if (( !KERNEL_OK )) ||
    { (( !FORCE )) && stamp_ok "$GUEST_DIR/.vmlinux.stamp" "$KERNEL_HASH" "$VMLINUX" "$KRELEASE_FILE"; }; then
    step_skip "$KRELEASE"
else
    unpack_kernel
    vmlinuz=$KTREE/boot/vmlinuz-$KRELEASE
    # The bzImage carries the kernel as a zstd frame: find its magic and
    # decompress from there. zstd exits non-zero on the trailing bytes after
    # the frame, so check the result instead of its exit status.
    offs=$(LC_ALL=C grep -obUaP -m 1 '\x28\xb5\x2f\xfd' "$vmlinuz" || true)
    off=${offs%%:*}
    [[ "$off" =~ ^[0-9]+$ ]] || die "no zstd frame found in $vmlinuz." \
        "The kernel package may not be zstd-compressed any more; scripts/build-guest.sh needs an update."
    tmp=$GUEST_DIR/.vmlinux.tmp.$$
    CLEANUP+=("$tmp")
    zerr=$(tail -c +$((off + 1)) "$vmlinuz" | zstd -dcq 2>&1 >"$tmp") || true
    magic=$(head -c 4 "$tmp" | od -An -tx1 | tr -d ' \n')
    size=$(stat -c %s "$tmp")
    if [[ "$magic" != 7f454c46 ]] || (( size < 20 * 1024 * 1024 )); then
        die "decompressing the kernel at offset $off gave no ELF vmlinux ($size bytes, magic $magic): $zerr" \
            "Delete $KDEB and re-run scripts/build-guest.sh."
    fi
    chmod 0644 "$tmp"
    printf '%s\n' "$KRELEASE" >"$KRELEASE_FILE.tmp.$$"
    CLEANUP+=("$KRELEASE_FILE.tmp.$$")
    mv -f "$tmp" "$VMLINUX"
    mv -f "$KRELEASE_FILE.tmp.$$" "$KRELEASE_FILE"
    stamp_write "$GUEST_DIR/.vmlinux.stamp" "$KERNEL_HASH"
    step_done "$KRELEASE, $(human_size "$size")"
fi

# --- b) guest agent ----------------------------------------------------------------------
step "Guest agent (forkvm-agent, static)"
FAIL_HINT="Fix the build error above (cargo build -p forkvm-agent) and re-run scripts/build-guest.sh."
command -v cargo >/dev/null 2>&1 || die "cargo not found." "Run scripts/setup.sh (it checks the Rust toolchain)."
agent_before=$(stat -c '%Y %s' "$AGENT_BIN" 2>/dev/null || true)
(cd "$REPO" && RUSTFLAGS='-C target-feature=+crt-static' \
    cargo build --release -p forkvm-agent --target "$GUEST_TARGET" --target-dir "$REPO/target/guest")
[[ -x "$AGENT_BIN" ]] || die "cargo did not produce $AGENT_BIN."
if [[ "$(file -b "$AGENT_BIN")" == *'dynamically linked'* ]]; then
    die "$AGENT_BIN is dynamically linked; it must be static to run as /init." \
        "Check that RUSTFLAGS/.cargo config do not override '-C target-feature=+crt-static'."
fi
AGENT_SHA=$(sha256sum "$AGENT_BIN" | cut -d' ' -f1)
if [[ "$agent_before" == "$(stat -c '%Y %s' "$AGENT_BIN")" ]]; then
    step_skip "${AGENT_SHA:0:12}"
else
    step_done "${AGENT_SHA:0:12}, $(human_size "$(stat -c %s "$AGENT_BIN")")"
fi

# --- c) initramfs ------------------------------------------------------------------------

# resolve_modules <modules dir>: sets MOD_ORDER to the paths (relative to the
# modules dir) of INITRAMFS_MODULES and their dependencies, dependencies first.
resolve_modules() {
    local mdir=$1 line path deps base name m
    declare -gA MOD_PATH=() MOD_DEPS=() MOD_SEEN=()
    MOD_ORDER=()
    while IFS= read -r line; do
        path=${line%%:*}
        deps=${line#*:}
        base=${path##*/}
        name=${base%%.ko*}
        name=${name//-/_}
        MOD_PATH[$name]=$path
        MOD_DEPS[$path]=$deps
    done <"$mdir/modules.dep"
    for m in "${INITRAMFS_MODULES[@]}"; do
        name=${m//-/_}
        if [[ -n "${MOD_PATH[$name]:-}" ]]; then
            _visit_module "${MOD_PATH[$name]}"
        elif grep -qE "/${name//_/[-_]}\.ko$" "$mdir/modules.builtin"; then
            info "$m is built into the kernel"
        else
            die "kernel module $m not found in $KPKG." \
                "Fix INITRAMFS_MODULES in scripts/build-guest.sh."
        fi
    done
}
# modules.dep lists a module's dependencies so that the last one must be
# loaded first: visit them in reverse order, then emit the module.
_visit_module() {
    local path=$1 i
    [[ -n "${MOD_SEEN[$path]:-}" ]] && return 0
    MOD_SEEN[$path]=1
    local -a deps
    read -r -a deps <<<"${MOD_DEPS[$path]:-}"
    for ((i = ${#deps[@]} - 1; i >= 0; i--)); do
        _visit_module "${deps[i]}"
    done
    MOD_ORDER+=("$path")
}

step "Initramfs: $INITRAMFS"
FAIL_HINT="Re-run scripts/build-guest.sh --force."
INITRAMFS_HASH=$(inputs_hash "initramfs-recipe=$INITRAMFS_RECIPE" "kernel=$KERNEL_HASH" \
    "agent=$AGENT_SHA" "modules=${INITRAMFS_MODULES[*]}" "dirs=${INITRAMFS_DIRS[*]}")
if (( !FORCE )) && stamp_ok "$GUEST_DIR/.initramfs.stamp" "$INITRAMFS_HASH" "$INITRAMFS"; then
    step_skip "$(human_size "$(stat -c %s "$INITRAMFS")")"
elif (( !KERNEL_OK )); then
    die "the initramfs must be rebuilt but the kernel package cannot be looked up." \
        "Run scripts/setup.sh (or apt-get update) and re-run scripts/build-guest.sh."
else
    unpack_kernel
    mdir=$KTREE/lib/modules/$KRELEASE
    info "depmod $KRELEASE"
    depmod -b "$KTREE" "$KRELEASE"
    resolve_modules "$mdir"
    stage=$(mktemp -d "$GUEST_DIR/.initramfs.stage.XXXXXX")
    CLEANUP+=("$stage")
    chmod 0755 "$stage"
    for d in "${INITRAMFS_DIRS[@]}" etc/forkvm lib/modules; do
        install -d -m 0755 "$stage/$d"
    done
    chmod 1777 "$stage/tmp"
    install -m 0755 "$AGENT_BIN" "$stage/init"
    : >"$stage/etc/forkvm/modules.list"
    names=()
    for rel in "${MOD_ORDER[@]}"; do
        src=$mdir/$rel
        base=${rel##*/}
        case "$base" in
            *.ko.xz)  ko=${base%.xz};  xz -dc "$src" >"$stage/lib/modules/$ko" ;;
            *.ko.zst) ko=${base%.zst}; zstd -dcq "$src" >"$stage/lib/modules/$ko" ;;
            *.ko.gz)  ko=${base%.gz};  gzip -dc "$src" >"$stage/lib/modules/$ko" ;;
            *.ko)     ko=$base;        cp "$src" "$stage/lib/modules/$ko" ;;
            *) die "unexpected module file $rel" ;;
        esac
        chmod 0644 "$stage/lib/modules/$ko"
        printf '%s\n' "$ko" >>"$stage/etc/forkvm/modules.list"
        names+=("${ko%.ko}")
    done
    chmod 0644 "$stage/etc/forkvm/modules.list"
    # Fixed timestamps: the same inputs give the same archive.
    find "$stage" -mindepth 1 -exec touch -h -d @0 {} +
    tmp=$GUEST_DIR/.initramfs.img.tmp.$$
    CLEANUP+=("$tmp")
    (cd "$stage" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort |
        cpio -o -H newc --owner=0:0 --reproducible --quiet) | gzip -9 -n >"$tmp"
    listing=$(gzip -dc "$tmp" | cpio -t --quiet)
    [[ $'\n'"$listing"$'\n' == *$'\ninit\n'* ]] || die "the new initramfs does not contain /init."
    # Pad with zeros to a whole number of 4 KiB pages. QEMU's microvm loads
    # the initrd so that it ends just below the top of guest RAM, where the
    # firmware has already put the ACPI tables (the last ~0x300 bytes): an
    # initrd whose size is not page-aligned overwrites the DSDT with its
    # tail, and the kernel then hangs checksumming a garbage table right
    # after "ACPI: Core revision". Page-aligned, it ends a page lower.
    # The kernel skips zero bytes between and after cpio archives.
    size=$(stat -c %s "$tmp")
    pad=$(( (4096 - size % 4096) % 4096 ))
    (( pad == 0 )) || head -c "$pad" /dev/zero >>"$tmp"
    chmod 0644 "$tmp"
    mv -f "$tmp" "$INITRAMFS"
    stamp_write "$GUEST_DIR/.initramfs.stamp" "$INITRAMFS_HASH"
    info "modules (load order): ${names[*]}"
    step_done "$(human_size "$(stat -c %s "$INITRAMFS")")"
fi

# --- d) default image --------------------------------------------------------------------
write_image_json() {
    local created=$1 size pkgs='' p
    size=$(stat -c %s "$ROOTFS")
    for p in "${IMAGE_PKGS[@]}"; do pkgs+="${pkgs:+,}\"$p\""; done
    printf '{"name":"default","format":"ext4","size_bytes":%s,"created_at":"%s","description":"%s","packages":[%s]}\n' \
        "$size" "$created" "$IMAGE_DESCRIPTION" "$pkgs" >"$IMAGE_JSON.tmp.$$"
    chmod 0644 "$IMAGE_JSON.tmp.$$"
    mv -f "$IMAGE_JSON.tmp.$$" "$IMAGE_JSON"
}

step "Default image: $ROOTFS"
FAIL_HINT="Check access to the Debian mirror (log: $LOG_DIR/mmdebstrap.log) and re-run scripts/build-guest.sh."
IMAGE_HASH=$(inputs_hash "image-recipe=$IMAGE_RECIPE" "suite=$IMAGE_SUITE" "variant=$IMAGE_VARIANT" \
    "packages=${IMAGE_PKGS[*]}" "size=$IMAGE_SIZE" "description=$IMAGE_DESCRIPTION")
if [[ "${FORKVM_SKIP_IMAGE:-0}" == 1 ]]; then
    _step_result "$C_YELLOW" skipped "(FORKVM_SKIP_IMAGE=1)"
elif (( !FORCE )) && stamp_ok "$IMAGE_DIR/.rootfs.stamp" "$IMAGE_HASH" "$ROOTFS"; then
    if [[ ! -s "$IMAGE_JSON" ]]; then
        write_image_json "$(date -u -r "$ROOTFS" +%Y-%m-%dT%H:%M:%SZ)"
        info "rewrote $IMAGE_JSON"
    fi
    step_skip "$(human_size "$(stat -c %s "$ROOTFS")")"
else
    mirror=$(apt_mirror_uri) ||
        die "no 'bookworm' entry found in the host apt sources to take the mirror from." \
            "Configure a Debian bookworm mirror for apt, then re-run scripts/build-guest.sh."
    build=$(mktemp -d "$IMAGE_DIR/.rootfs.build.XXXXXX")
    CLEANUP+=("$build")
    chmod 0755 "$build"
    info "mmdebstrap $IMAGE_SUITE ($IMAGE_VARIANT + ${IMAGE_PKGS[*]}) from $mirror"
    info "this takes ~1-3 minutes; log: $LOG_DIR/mmdebstrap.log"
    include=$(IFS=,; printf '%s' "${IMAGE_PKGS[*]}")
    # unshare mode as root: a private mount namespace, so nothing can stay
    # mounted on the host if the build is interrupted.
    run_long "$LOG_DIR/mmdebstrap.log" \
        mmdebstrap --mode=unshare --variant="$IMAGE_VARIANT" --include="$include" \
        "$IMAGE_SUITE" "$build" "$mirror" ||
        die "mmdebstrap failed (log: $LOG_DIR/mmdebstrap.log)." \
            "Check access to the Debian mirror $mirror and re-run scripts/build-guest.sh."
    [[ -x "$build/usr/bin/python3" ]] || die "mmdebstrap produced no /usr/bin/python3."

    info "configuring the image"
    printf 'forkvm\n' >"$build/etc/hostname"
    printf '127.0.0.1\tlocalhost\n127.0.1.1\tforkvm\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
        >"$build/etc/hosts"
    rm -f "$build/etc/machine-id" "$build/etc/resolv.conf"
    : >"$build/etc/machine-id"
    # Placeholder: QEMU user networking's DNS; the agent may rewrite it.
    printf 'nameserver 10.0.2.3\n' >"$build/etc/resolv.conf"
    chmod 0644 "$build/etc/hostname" "$build/etc/hosts" "$build/etc/machine-id" "$build/etc/resolv.conf"
    # Shrink: apt lists and caches, install logs, backup files.
    if [[ -d "$build/var/lib/apt/lists" ]]; then
        find "$build/var/lib/apt/lists" -mindepth 1 -maxdepth 1 ! -name partial -exec rm -rf {} +
    fi
    if [[ -d "$build/var/cache/apt" ]]; then
        find "$build/var/cache/apt" -type f -delete
    fi
    rm -f "$build"/var/log/apt/*.log "$build"/var/log/{dpkg,alternatives,bootstrap}.log \
        "$build"/var/cache/debconf/*-old "$build"/var/lib/dpkg/*-old

    tmp=$IMAGE_DIR/.rootfs.ext4.tmp.$$
    CLEANUP+=("$tmp")
    info "mkfs.ext4 ($IMAGE_SIZE, sparse)"
    mkfs.ext4 -q -F -L forkvm-root -d "$build" "$tmp" "$IMAGE_SIZE" >/dev/null
    # Images have no /lost+found (docs/images.md). IMAGE_RECIPE is not
    # bumped for this: an installed default image, which snapshots may sit
    # on, keeps its empty one until a --force rebuild.
    debugfs -w -R "rmdir /lost+found" "$tmp" >/dev/null 2>&1 ||
        die "debugfs could not remove /lost+found from the new image." "Check e2fsprogs."
    chmod 0444 "$tmp"
    mv -f "$tmp" "$ROOTFS"
    write_image_json "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    stamp_write "$IMAGE_DIR/.rootfs.stamp" "$IMAGE_HASH"
    used=$(du -B1 "$ROOTFS" | cut -f1)
    step_done "$(human_size "$(stat -c %s "$ROOTFS")") ($(human_size "$used") allocated)"
fi

cleanup
CLEANUP=()

# --- e) summary --------------------------------------------------------------------------
log ""
log "${C_BOLD}Guest artefacts in $FORKVM_HOME:${C_RESET}"
for f in "$VMLINUX" "$KRELEASE_FILE" "$INITRAMFS" "$ROOTFS" "$IMAGE_JSON"; do
    if [[ -e "$f" ]]; then
        sz=$(stat -c %s "$f")
        used=$(du -B1 "$f" | cut -f1)
        extra=''
        (( used < sz / 2 )) && extra=" ($(human_size "$used") allocated)"
        printf '  %-52s %10s%s\n' "$f" "$(human_size "$sz")" "$extra"
    else
        printf '  %-52s %10s\n' "$f" "(missing)"
    fi
done
log "kernel: $(cat "$KRELEASE_FILE" 2>/dev/null || echo '?')"
log "total time: $(elapsed "$T_START")"
