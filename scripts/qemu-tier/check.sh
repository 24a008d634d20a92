#!/usr/bin/env bash
# The real-QEMU tier: `check`, whether this machine can run it, and why not.
# Sourced by scripts/qemu-tier/run.sh (not run on its own), after common.sh.
# shellcheck disable=SC2154 # the lowercase settings (tier_dir, pool, ...) are set in common.sh

# Prints the reason this machine cannot run the tier, or nothing.
skip_reason() {
    [[ $(id -u) -eq 0 ]] || { echo "not root (needs chroot, mount and a system libvirtd)"; return; }
    [[ $(uname -m) == x86_64 ]] || { echo "not x86_64 ($(uname -m))"; return; }
    local tool
    for tool in chroot mount umount mountpoint findmnt flock sha256sum timeout ip nsenter; do
        command -v "$tool" >/dev/null || { echo "$tool is not installed"; return; }
    done
    # QEMU's pty serial console and the daemons need these device nodes, and the image
    # zone's guests their NIC's tap device.
    local node
    for node in /dev/null /dev/zero /dev/urandom /dev/ptmx /dev/net/tun; do
        [[ -c $node ]] || { echo "no $node"; return; }
    done
    # The image zone's libvirtd runs in a network namespace of its own (network.sh).
    local ns=bigfleet-probe-$$
    ip netns add "$ns" 2>/dev/null || { echo "cannot create a network namespace (ip netns add)"; return; }
    ip netns delete "$ns"
    # Mounting (proc, bind mounts) must be allowed; a restricted container forbids it.
    local probe
    probe=$(mktemp -d)
    if ! mount -t tmpfs bigfleet-probe "$probe" 2>/dev/null; then
        rmdir "$probe"
        echo "cannot mount filesystems (restricted container?)"
        return
    fi
    umount "$probe"
    rmdir "$probe"
    # The zones are overlayfs mounts of the chroot, with their upper layers under
    # $tier_dir: probe on that file system (an overlay root cannot hold an upper layer).
    local parent=$tier_dir
    while [[ ! -d $parent ]]; do parent=$(dirname "$parent"); done
    probe=$(mktemp -d -p "$parent" .bigfleet-overlay-probe.XXXXXX) \
        || { echo "cannot create a directory under $parent"; return; }
    mkdir -p "$probe/lower" "$probe/upper" "$probe/work" "$probe/merged"
    if ! mount -t overlay bigfleet-probe -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" \
        "$probe/merged" 2>/dev/null; then
        rm -rf "$probe"
        echo "cannot mount overlayfs under $parent (the two zones are overlays of one chroot)"
        return
    fi
    umount "$probe/merged"
    rm -rf "$probe"
    local available
    available=$(awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo)
    # Three daemons and up to three 384 MiB guests, or two 1 GiB real-image guests, at once.
    ((available >= 3072)) || { echo "only ${available} MiB of memory available (needs 3072)"; return; }
    # Everything below is only needed to build the chroot.
    if base_ready; then return; fi
    local free_mb
    free_mb=$(df -Pm "$parent" | awk 'NR == 2 { print $4 }')
    ((free_mb >= 1536)) || { echo "only ${free_mb} MiB free under $parent (needs 1536)"; return; }
    command -v apt-get >/dev/null || { echo "no apt-get (not a Debian-like host)"; return; }
    if ! command -v debootstrap >/dev/null; then
        local candidate
        candidate=$(apt-cache policy debootstrap 2>/dev/null | awk '/Candidate:/ { print $2 }')
        [[ -n $candidate && $candidate != "(none)" ]] \
            || { echo "debootstrap is not installed and apt has no candidate for it"; return; }
    fi
    local url
    url="$(mirror)/dists/$suite/InRelease"
    if command -v curl >/dev/null; then
        curl -fsS -m 15 -o /dev/null -r 0-0 "$url" 2>/dev/null || { echo "mirror unreachable: $url"; return; }
    elif command -v wget >/dev/null; then
        wget -q -T 15 -O /dev/null "$url" || { echo "mirror unreachable: $url"; return; }
    fi
}

# Succeeds, after printing why, when this machine cannot run the tier.
skipped() {
    local reason
    reason=$(skip_reason)
    [[ -n $reason ]] || return 1
    echo "qemu tier: skipped: $reason"
}

cmd_check() {
    if skipped; then
        exit 3
    fi
}
