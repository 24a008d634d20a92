#!/usr/bin/env bash
# The real-QEMU test tier: two real libvirtd + QEMU (TCG) hosts from one Debian 12 chroot,
# and a tiny guest (Debian cloud kernel + busybox/qemu-ga initramfs) the provider can drive
# through the guest agent. The chroot is only built and never run in: each zone (a and b)
# is an overlayfs mount on top of it with its own upper layer, so the two daemons share the
# packages and the guest but each has its own /etc/libvirt, /run, /var/lib/libvirt (pool
# and golden image) and /var/log. The chroot keeps the host untouched: installing Debian 12's
# qemu-system-x86 on the host would remove its newer qemu-utils (qemu-img 10.0.2, from
# bookworm-backports), which declares Breaks: qemu-system-common (<< 8.0).
#
#   scripts/qemu-tier.sh check     exit 0 if this machine can run the tier, else print
#                                  "qemu tier: skipped: <reason>" and exit 3
#   scripts/qemu-tier.sh prepare   build the chroot and the guest (idempotent; fast when done)
#   scripts/qemu-tier.sh start     mount both zones, start virtlogd + libvirtd in each, create
#                                  each zone's pool and golden image
#   scripts/qemu-tier.sh env       print the BIGFLEET_QEMU_* export lines for the test
#   scripts/qemu-tier.sh stop      remove every domain, stop the daemons, unmount
#   scripts/qemu-tier.sh ci        check (skip = exit 0), prepare, start, run the qemu_e2e
#                                  and qemu_faults tests (tests/tests/), always stop; exits
#                                  with the tests' status
#   scripts/qemu-tier.sh libvirtd ZONE kill|term|start
#                                  SIGKILL / SIGTERM (waiting for it to exit) / start (waiting
#                                  until it answers) one zone's libvirtd; takes no lock, for
#                                  the fault tests while ci runs them
#   scripts/qemu-tier.sh virsh ... virsh against zone a's daemon (QEMU_TIER_ZONE=b: zone b's)
#   scripts/qemu-tier.sh shell     a shell inside the chroot (mounts it first)
#
# Environment: QEMU_TIER_DIR (default /var/tmp/bigfleet-qemu-tier) holds the chroot in
# $QEMU_TIER_DIR/bookworm and the zones in $QEMU_TIER_DIR/zone-{a,b} (every socket, pid
# file, pool and log lives under it); QEMU_TIER_MIRROR overrides the Debian mirror debootstrap uses
# (default: the host's, from /etc/apt/sources.list.d/debian.sources). Needs root, x86_64,
# apt and the mirror (only while the chroot is built).
# Paths inside a zone (/guest/vmlinuz, the pool directory) are what its libvirtd sees; the
# tests talk to each daemon through its zone's socket from the host.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
guest_src=$repo/scripts/qemu-tier
tier_dir=$(realpath -m "${QEMU_TIER_DIR:-/var/tmp/bigfleet-qemu-tier}")
R=$tier_dir/bookworm

suite=bookworm
# Packages installed in the chroot (the daemon, QEMU, the tools, and the guest's parts).
chroot_packages=(libvirt-daemon libvirt-daemon-driver-qemu qemu-system-x86 qemu-utils
    libvirt-clients qemu-guest-agent busybox-static cpio kmod ovmf)
# Bump when the chroot recipe changes in a way that needs a fresh debootstrap.
base_recipe=2
# The zones: overlay mounts of the chroot, one libvirtd each.
zones=(a b)

pool=bigfleet
pool_dir=/var/lib/libvirt/images/bigfleet
image=golden.qcow2
image_size=256M
kernel=/guest/vmlinuz
initrd=/guest/initrd.img
cmdline='console=ttyS0 panic=-1'

# Markers: the base chroot (debootstrap + packages + daemon config) and the guest build.
base_marker=$R/.bigfleet-base
guest_marker=$R/guest/.bigfleet-guest

say() { echo "qemu-tier: $*" >&2; }

# A zone's root, its overlay layers, and running a function with R pointing at the zone
# (every helper below works on "$R", so this is all a zone needs).
zone_dir() { echo "$tier_dir/zone-$1"; }
zone_root() { echo "$tier_dir/zone-$1/root"; }
in_zone() {
    local R
    R=$(zone_root "$1")
    shift
    "$@"
}
valid_zone() {
    local z
    for z in "${zones[@]}"; do [[ $1 == "$z" ]] && return 0; done
    die "unknown zone ${1@Q} (zones: ${zones[*]})"
}
die() {
    say "ERROR: $*"
    exit 1
}

# Commands inside the chroot run with a clean environment (no host PATH, locale, etc.).
in_chroot() {
    chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 \
        DEBIAN_FRONTEND=noninteractive "$@"
}

virsh_() { in_chroot timeout 60 virsh -q -c qemu:///system "$@"; }

# QEMU_TIER_MIRROR, else the host's Debian mirror (first URIs: line of the deb822 sources),
# else deb.debian.org.
mirror() {
    local uri=${QEMU_TIER_MIRROR:-}
    if [[ -z $uri && -r /etc/apt/sources.list.d/debian.sources ]]; then
        uri=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources)
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

base_stamp() { printf '%s\n' "$base_recipe" "$suite" "${chroot_packages[@]}" | sha256sum | cut -c1-16; }

# The guest stamp covers the guest files' content (init, hooks, build script) and the base.
guest_stamp() {
    { base_stamp; cat "$guest_src"/init "$guest_src"/bootstrap "$guest_src"/drain \
        "$guest_src"/shutdown "$guest_src"/build-initramfs; } | sha256sum | cut -c1-16
}

base_ready() { [[ -f $base_marker && $(cat "$base_marker") == "$(base_stamp)" ]]; }
guest_ready() {
    [[ -f $guest_marker && $(cat "$guest_marker") == "$(guest_stamp)" && -s $R$kernel && -s $R$initrd ]]
}

# One mutating subcommand at a time (prepare/start/stop/ci share the chroot). The lock is
# fd 9; the daemons are started with it closed so they never hold it.
lock() {
    mkdir -p "$tier_dir"
    exec 9>"$tier_dir/.lock"
    flock -w 600 9 || die "another qemu-tier.sh holds $tier_dir/.lock"
}

# --- check ---------------------------------------------------------------------------------

# Prints the reason this machine cannot run the tier, or nothing.
skip_reason() {
    [[ $(id -u) -eq 0 ]] || { echo "not root (needs chroot, mount and a system libvirtd)"; return; }
    [[ $(uname -m) == x86_64 ]] || { echo "not x86_64 ($(uname -m))"; return; }
    local tool
    for tool in chroot mount umount mountpoint findmnt flock sha256sum timeout; do
        command -v "$tool" >/dev/null || { echo "$tool is not installed"; return; }
    done
    # QEMU's pty serial console and the daemons need these device nodes. (No /dev/net/tun:
    # the tier's domains have no NIC.)
    local node
    for node in /dev/null /dev/zero /dev/urandom /dev/ptmx; do
        [[ -c $node ]] || { echo "no $node"; return; }
    done
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
    # Two daemons and up to three 384 MiB TCG guests at once.
    ((available >= 2048)) || { echo "only ${available} MiB of memory available (needs 2048)"; return; }
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

# --- mounts and daemons --------------------------------------------------------------------

# proc, dev and sys inside the chroot (only those not mounted yet). dev and sys are recursive
# binds made slaves, so nothing done under the chroot (including umount -R) propagates back
# to the host's /dev or /sys.
mount_chroot() {
    mountpoint -q "$R/proc" || mount -t proc proc "$R/proc"
    local fs
    for fs in dev sys; do
        if ! mountpoint -q "$R/$fs"; then
            mount --rbind "/$fs" "$R/$fs"
            mount --make-rslave "$R/$fs"
        fi
    done
}

# Every mount at or below the chroot, deepest first (umount -R on the top ones).
unmount_chroot() {
    local target
    while read -r target; do
        mountpoint -q "$target" || continue
        umount -R "$target" 2>/dev/null || umount -R -l "$target"
    done < <(findmnt -rn -o TARGET | awk -v r="$R/" 'index($0, r) == 1' | sort -r)
}

# The PID in a pid file, if that process is alive and runs inside this chroot.
chroot_pid() {
    local file=$R/run/$1.pid pid root
    [[ -s $file ]] || return 1
    pid=$(cat "$file")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    root=$(readlink "/proc/$pid/root" 2>/dev/null) || return 1
    [[ $root == "$R" ]]
    echo "$pid"
}

# Every process whose root directory is the chroot (QEMU, the daemons, stragglers).
chroot_pids() {
    local dir pid
    for dir in /proc/[0-9]*; do
        pid=${dir#/proc/}
        [[ $(readlink "$dir/root" 2>/dev/null) == "$R" ]] && echo "$pid"
    done
    return 0
}

# Sends TERM to the PIDs, waits up to $1 seconds, then KILLs what is left.
terminate() {
    local grace=$1 pid left i
    shift
    (($# > 0)) || return 0
    kill -TERM "$@" 2>/dev/null || true
    for ((i = 0; i < grace * 10; i++)); do
        left=0
        for pid in "$@"; do [[ -d /proc/$pid ]] && left=1; done
        ((left)) || return 0
        sleep 0.1
    done
    say "still running after ${grace}s, killing: $*"
    kill -KILL "$@" 2>/dev/null || true
    sleep 0.5
}

daemon_answers() { in_chroot timeout 10 virsh -q -c qemu:///system version >/dev/null 2>&1; }

# --- prepare -------------------------------------------------------------------------------

install_debootstrap() {
    command -v debootstrap >/dev/null && return
    say "installing debootstrap on the host"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap; then
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap
    fi
}

build_base() {
    local started=$SECONDS
    install_debootstrap
    # A half-built or outdated chroot is thrown away (after unmounting anything in it).
    if [[ -e $R ]]; then
        say "removing the old chroot $R"
        unmount_chroot
        rm -rf --one-file-system "$R"
    fi
    mkdir -p "$tier_dir"
    say "debootstrap --variant=minbase $suite from $(mirror)"
    debootstrap --variant=minbase "$suite" "$R" "$(mirror)" >"$tier_dir/debootstrap.log" 2>&1 \
        || { tail -n 20 "$tier_dir/debootstrap.log" >&2; die "debootstrap failed (log: $tier_dir/debootstrap.log)"; }
    say "debootstrap: $((SECONDS - started))s"

    # The host's Debian sources (with -updates and -security; no third-party repositories),
    # else debootstrap's own sources.list for the mirror; and the host's DNS. No services
    # may start while packages are installed (nothing runs in the chroot as init).
    if [[ -z ${QEMU_TIER_MIRROR:-} && -r /etc/apt/sources.list.d/debian.sources ]]; then
        cp /etc/apt/sources.list.d/debian.sources "$R/etc/apt/sources.list.d/"
        rm -f "$R/etc/apt/sources.list"
    fi
    cp -L /etc/resolv.conf "$R/etc/resolv.conf"
    printf '#!/bin/sh\nexit 101\n' >"$R/usr/sbin/policy-rc.d"
    chmod 755 "$R/usr/sbin/policy-rc.d"

    local installing=$SECONDS
    mount_chroot
    in_chroot apt-get update -q >"$tier_dir/apt.log" 2>&1 \
        || { tail -n 20 "$tier_dir/apt.log" >&2; die "apt-get update in the chroot failed"; }
    in_chroot apt-get install -y -q --no-install-recommends "${chroot_packages[@]}" >>"$tier_dir/apt.log" 2>&1 \
        || { tail -n 20 "$tier_dir/apt.log" >&2; die "apt-get install in the chroot failed (log: $tier_dir/apt.log)"; }
    in_chroot apt-get clean
    say "packages: $((SECONDS - installing))s"

    # The users the QEMU driver resolves at start-up (libvirt-daemon-system is not installed).
    in_chroot sh -c 'getent group libvirt-qemu >/dev/null || groupadd -r libvirt-qemu
        getent passwd libvirt-qemu >/dev/null || useradd -r -g libvirt-qemu -d /var/lib/libvirt libvirt-qemu'

    # qemu.conf: QEMU runs as root without a security driver; namespaces = [ ] because the
    # chroot cannot make its mounts private ("Failed disable mount propagation out of the
    # root filesystem"); cgroup_controllers = [ ] so libvirt leaves the host's cgroups alone.
    # (Debian 12 ships these files in libvirt-daemon-system, which is not installed, so they
    # only hold these settings; everything else keeps libvirt's built-in defaults.)
    {
        echo '# bigfleet qemu tier (scripts/qemu-tier.sh)'
        echo 'user = "root"'
        echo 'group = "root"'
        echo 'security_driver = "none"'
        echo 'namespaces = [ ]'
        echo 'cgroup_controllers = [ ]'
    } >"$R/etc/libvirt/qemu.conf"
    # libvirtd logs to a file (no journal in the chroot).
    {
        echo '# bigfleet qemu tier (scripts/qemu-tier.sh)'
        echo 'log_outputs = "3:file:/var/log/libvirt/libvirtd.log"'
    } >"$R/etc/libvirt/libvirtd.conf"
    mkdir -p "$R/var/log/libvirt" "$R/run/libvirt" "$R$pool_dir"

    base_stamp >"$base_marker"
}

build_guest() {
    local started=$SECONDS
    mkdir -p "$R/guest"
    # apt and the build script need /proc and /dev (process substitution uses /dev/fd).
    mount_chroot
    # The Debian cloud kernel, unpacked from its .deb (not installed). The name of the
    # versioned package changes with Debian updates: ask the meta-package.
    if ! compgen -G "$R/guest/kroot/boot/vmlinuz-*" >/dev/null; then
        local package
        package=$(in_chroot apt-cache depends linux-image-cloud-amd64 \
            | awk '/Depends: linux-image-/ && !found { print $2; found = 1 }')
        [[ -n $package ]] || die "cannot resolve linux-image-cloud-amd64 in the chroot"
        say "kernel: $package"
        rm -rf "$R/guest/pkgs" "$R/guest/kroot"
        mkdir -p "$R/guest/pkgs"
        in_chroot sh -c "chown _apt /guest/pkgs && cd /guest/pkgs && apt-get download -q $package >/dev/null \
            && dpkg -x ./*.deb /guest/kroot" \
            || { rm -rf "$R/guest/kroot"; die "downloading $package failed"; }
        rm -rf "$R/guest/pkgs"
    fi
    # The initramfs, built inside the chroot from the guest files.
    rm -rf "$R/guest/src"
    mkdir -p "$R/guest/src"
    cp "$guest_src"/{init,bootstrap,drain,shutdown,build-initramfs} "$R/guest/src/"
    in_chroot /bin/bash /guest/src/build-initramfs || die "building the guest failed"
    guest_stamp >"$guest_marker"
    say "guest: $((SECONDS - started))s"
}

# Whether any zone's libvirtd runs (the chroot under it must not change then).
tier_running() {
    local z
    for z in "${zones[@]}"; do
        in_zone "$z" chroot_pid libvirtd >/dev/null && return 0
    done
    return 1
}

cmd_prepare() {
    local started=$SECONDS
    if ! base_ready || ! guest_ready; then
        tier_running && die "the tier is running with an outdated chroot; run: $0 stop"
        # Zones mounted on the old chroot go with it.
        unmount_zones
    fi
    if ! base_ready; then
        rm -f "$R/guest/.bigfleet-guest" 2>/dev/null || true
        build_base
    fi
    if ! guest_ready; then
        build_guest
    fi
    say "prepared $R ($((SECONDS - started))s)"
}

# --- start / stop --------------------------------------------------------------------------

# Mounts zone $1 (an overlay of the chroot) unless it is mounted. Its upper layer is thrown
# away when the chroot was rebuilt since it was made (an overlay on a changed lower layer
# is not coherent).
mount_zone() {
    local dir root stamp
    dir=$(zone_dir "$1")
    root=$(zone_root "$1")
    mountpoint -q "$root" && return 0
    stamp="$(base_stamp) $(guest_stamp)"
    if [[ ! -f $dir/.stamp || $(cat "$dir/.stamp") != "$stamp" ]]; then
        rm -rf --one-file-system "$dir/upper" "$dir/work"
    fi
    mkdir -p "$dir/upper" "$dir/work" "$root"
    mount -t overlay "bigfleet-zone-$1" -o "lowerdir=$R,upperdir=$dir/upper,workdir=$dir/work" "$root" \
        || die "cannot mount zone $1's overlay on $root"
    echo "$stamp" >"$dir/.stamp"
}

# Starts virtlogd and libvirtd in the zone at $R (no waiting). The daemons daemonize
# themselves and write pid files (no init system in the chroot).
launch_daemons() {
    mount_chroot
    mkdir -p "$R/var/log/libvirt" "$R/run/libvirt" "$R$pool_dir"
    if ! chroot_pid virtlogd >/dev/null; then
        rm -f "$R/run/virtlogd.pid"
        in_chroot virtlogd -d -p /run/virtlogd.pid 9>&-
    fi
    launch_libvirtd
}

launch_libvirtd() {
    if ! chroot_pid libvirtd >/dev/null; then
        rm -f "$R/run/libvirtd.pid"
        in_chroot libvirtd -d -p /run/libvirtd.pid 9>&-
    fi
}

# Waits until the libvirtd at $R answers (its first start probes QEMU's capabilities).
await_libvirtd() {
    local waited=0
    until daemon_answers; do
        ((waited < 120)) || die "libvirtd in $R does not answer after 60s (log: $R/var/log/libvirt/libvirtd.log)"
        chroot_pid libvirtd >/dev/null || die "libvirtd in $R exited (log: $R/var/log/libvirt/libvirtd.log)"
        sleep 0.5
        ((waited += 1))
    done
}

# The storage pool and the golden image the provider's overlays are backed by, at $R.
ensure_pool() {
    if ! virsh_ pool-info "$pool" >/dev/null 2>&1; then
        virsh_ pool-define-as "$pool" dir --target "$pool_dir" >/dev/null
    fi
    local info
    info=$(virsh_ pool-info "$pool")
    if ! grep -Eq '^State:[[:space:]]+running' <<<"$info"; then
        virsh_ pool-start "$pool" >/dev/null
    fi
    virsh_ pool-refresh "$pool" >/dev/null
    if ! virsh_ vol-info --pool "$pool" "$image" >/dev/null 2>&1; then
        virsh_ vol-create-as "$pool" "$image" "$image_size" --format qcow2 >/dev/null
    fi
}

cmd_start() {
    local started=$SECONDS z
    if ! base_ready || ! guest_ready; then die "not prepared; run: $0 prepare"; fi
    # Both daemons probe QEMU at once, then each gets its pool.
    for z in "${zones[@]}"; do
        mount_zone "$z"
        in_zone "$z" launch_daemons
    done
    for z in "${zones[@]}"; do
        in_zone "$z" await_libvirtd
        in_zone "$z" ensure_pool
        say "zone $z: libvirtd pid $(in_zone "$z" chroot_pid libvirtd), virtlogd pid $(in_zone "$z" chroot_pid virtlogd)"
    done
    say "started zones ${zones[*]} with pool $pool and image $image ($((SECONDS - started))s)"
}

# Removes every domain and every volume but the golden image at $R, stops its daemons and
# whatever else runs there, and undoes its mounts.
stop_root() {
    if chroot_pid libvirtd >/dev/null && daemon_answers; then
        local domain volume
        while read -r domain; do
            [[ -n $domain ]] || continue
            virsh_ destroy "$domain" >/dev/null 2>&1 || true
            virsh_ undefine --managed-save --snapshots-metadata --nvram "$domain" >/dev/null 2>&1 \
                || virsh_ undefine "$domain" >/dev/null 2>&1 || true
            say "removed domain $domain"
        done < <(virsh_ list --all --name 2>/dev/null)
        if virsh_ pool-refresh "$pool" >/dev/null 2>&1; then
            while read -r volume _; do
                [[ -n $volume && $volume != "$image" ]] || continue
                virsh_ vol-delete --pool "$pool" "$volume" >/dev/null 2>&1 || true
            done < <(virsh_ vol-list "$pool" 2>/dev/null)
        fi
    fi
    # The daemons, by the PIDs in their pid files.
    local pid
    if pid=$(chroot_pid libvirtd); then terminate 15 "$pid"; fi
    if pid=$(chroot_pid virtlogd); then terminate 10 "$pid"; fi
    rm -f "$R/run/libvirtd.pid" "$R/run/virtlogd.pid"
    # Anything else still running inside (a QEMU orphaned by a killed daemon).
    local left
    mapfile -t left < <(chroot_pids)
    if ((${#left[@]} > 0)); then
        say "stopping leftover processes in $R: ${left[*]}"
        terminate 10 "${left[@]}"
    fi
    unmount_chroot
}

# Undoes each zone's mounts (its kernel filesystems, then the overlay itself).
unmount_zones() {
    local z root
    for z in "${zones[@]}"; do
        root=$(zone_root "$z")
        mountpoint -q "$root" || continue
        in_zone "$z" unmount_chroot
        umount "$root" 2>/dev/null || umount -l "$root"
    done
}

cmd_stop() {
    [[ -d $R ]] || return 0
    local z
    for z in "${zones[@]}"; do
        mountpoint -q "$(zone_root "$z")" || continue
        in_zone "$z" stop_root
    done
    unmount_zones
    # The chroot itself: mounts left by prepare (and daemons of an older, single-zone tier).
    stop_root
    say "stopped"
}

# `libvirtd ZONE kill|term|start`: fault injection for the tests. No lock (ci holds it
# while the tests run); the zone must be mounted (the tier started).
cmd_libvirtd() {
    local z=${1:-} action=${2:-} pid
    valid_zone "$z"
    mountpoint -q "$(zone_root "$z")" || die "zone $z is not mounted; run: $0 start"
    case $action in
    kill)
        pid=$(in_zone "$z" chroot_pid libvirtd) || die "zone $z's libvirtd is not running"
        kill -KILL "$pid"
        while [[ -d /proc/$pid ]]; do sleep 0.05; done
        ;;
    term)
        pid=$(in_zone "$z" chroot_pid libvirtd) || die "zone $z's libvirtd is not running"
        in_zone "$z" terminate 15 "$pid"
        ;;
    start)
        in_zone "$z" launch_libvirtd
        in_zone "$z" await_libvirtd
        ;;
    *) die "usage: $0 libvirtd ZONE kill|term|start" ;;
    esac
}

cmd_env() {
    local z root upper
    for z in "${zones[@]}"; do
        root=$(zone_root "$z")
        # Zone a keeps the unsuffixed names (the single-host tests use it).
        upper=${z^^}
        [[ $z == a ]] && upper=
        echo "export BIGFLEET_QEMU_URI${upper:+_$upper}='qemu+unix:///system?socket=$root/run/libvirt/libvirt-sock'"
        # Where that libvirtd's file system is on the host (the tests read golden images there).
        echo "export BIGFLEET_QEMU_ROOT${upper:+_$upper}='$root'"
    done
    echo "export BIGFLEET_QEMU_POOL='$pool'"
    echo "export BIGFLEET_QEMU_IMAGE='$image'"
    echo "export BIGFLEET_QEMU_KERNEL='$kernel'"
    echo "export BIGFLEET_QEMU_INITRD='$initrd'"
    echo "export BIGFLEET_QEMU_CMDLINE='$cmdline'"
    # The fault tests stop and start daemons through this script, in this tier.
    echo "export BIGFLEET_QEMU_TIER_SCRIPT='$repo/scripts/qemu-tier.sh'"
    echo "export QEMU_TIER_DIR='$tier_dir'"
}

# --- ci ------------------------------------------------------------------------------------

# Runs one step and prints how long it took.
timed() {
    local name=$1 started=$SECONDS
    shift
    "$@"
    echo "qemu tier: $name: $((SECONDS - started))s"
}

# The EXIT trap of ci: stop the tier, keep the exit status.
ci_cleanup() {
    local status=$?
    cmd_stop || say "stop failed"
    echo "qemu tier: total: $((SECONDS - ci_started))s"
    exit "$status"
}

cmd_ci() {
    if skipped; then
        return 0
    fi
    lock
    ci_started=$SECONDS
    # Whatever happens from here on, the daemons are stopped and the mounts undone; the
    # exit status is the first failure's (the test's, if everything before it worked).
    trap ci_cleanup EXIT
    timed stop-leftovers cmd_stop
    timed prepare cmd_prepare
    timed start cmd_start
    eval "$(cmd_env)"
    local test_started=$SECONDS status=0
    # The tests drive the real binary; cargo test builds it (the tests are its package's).
    (cd "$repo" && cargo test --locked -p bigfleet-libvirt --test integration -- \
            --ignored --nocapture --test-threads=1 qemu_e2e:: qemu_faults::) || status=$?
    echo "qemu tier: test: $((SECONDS - test_started))s (exit status $status)"
    exit "$status"
}

# The header comment of this file.
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }

case "${1:-}" in
check) cmd_check ;;
prepare)
    lock
    # The mounts prepare needs are undone when it ends (even on failure), unless the tier
    # is running.
    trap 'tier_running || unmount_chroot' EXIT
    cmd_prepare
    ;;
start) lock && cmd_start ;;
stop) lock && cmd_stop ;;
env) cmd_env ;;
ci) cmd_ci ;;
libvirtd)
    shift
    cmd_libvirtd "$@"
    ;;
virsh)
    shift
    zone=${QEMU_TIER_ZONE:-a}
    valid_zone "$zone"
    in_zone "$zone" chroot_pid libvirtd >/dev/null || die "zone $zone is not started; run: $0 start"
    in_zone "$zone" in_chroot virsh -c qemu:///system "$@"
    ;;
shell)
    base_ready || die "not prepared; run: $0 prepare"
    lock
    mount_chroot
    in_chroot TERM="${TERM:-dumb}" /bin/bash -l || true
    tier_running || unmount_chroot
    ;;
"" | -h | --help | help) usage ;;
*)
    usage >&2
    exit 2
    ;;
esac
