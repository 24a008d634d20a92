#!/usr/bin/env bash
# The real-QEMU tier: the chroot's kernel mounts and processes, and `prepare` (debootstrap,
# packages, daemon configuration, the guest kernel and initramfs).
# Sourced by scripts/qemu-tier/run.sh (not run on its own), after common.sh.
# shellcheck disable=SC2154 # the lowercase settings (tier_dir, pool, ...) are set in common.sh

# proc, dev and sys inside the chroot (only those not mounted yet). dev and sys are recursive
# binds made slaves, so nothing done under the chroot (including umount -R) propagates back
# to the host's /dev or /sys.
mount_chroot() {
    mountpoint -q "$R/proc" || mount -t proc proc "$R/proc"
    # The image zone's /sys is a sysfs of its network namespace (so libvirt sees the
    # namespace's bridge and NICs under /sys/class/net, not the host's).
    if in_image_zone && ! mountpoint -q "$R/sys"; then
        nsenter "--net=/run/netns/$(netns_name)" mount -t sysfs sysfs "$R/sys"
    fi
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

# Whether the chroot can be brought up to date by installing packages into it: its
# debootstrap was made by this recipe and suite, and every package it got is still on the
# list (the list only grew). A chroot whose package step failed qualifies too (its list of
# installed packages is empty until that step succeeds).
extendable() {
    [[ -f $bootstrap_marker && -f $packages_marker \
        && $(cat "$bootstrap_marker") == "$(bootstrap_stamp)" ]] || return 1
    local installed
    while read -r installed; do
        [[ " ${chroot_packages[*]} " == *" $installed "* ]] || return 1
    done <"$packages_marker"
}

build_base() {
    local started=$SECONDS
    install_debootstrap
    if extendable; then
        say "installing the missing packages into the existing chroot $R"
    else
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
        bootstrap_stamp >"$bootstrap_marker"
        : >"$packages_marker"
    fi

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
    # (apt-get installs only what is missing; dpkg first finishes an interrupted run.)
    in_chroot dpkg --configure -a >>"$tier_dir/apt.log" 2>&1 \
        || { tail -n 20 "$tier_dir/apt.log" >&2; die "dpkg --configure -a in the chroot failed"; }
    in_chroot apt-get install -y -q --no-install-recommends "${chroot_packages[@]}" >>"$tier_dir/apt.log" 2>&1 \
        || { tail -n 20 "$tier_dir/apt.log" >&2; die "apt-get install in the chroot failed (log: $tier_dir/apt.log)"; }
    in_chroot apt-get clean
    printf '%s\n' "${chroot_packages[@]}" >"$packages_marker"
    say "packages: $((SECONDS - installing))s"

    # The users the QEMU driver resolves at start-up (libvirt-daemon-system is not installed).
    in_chroot sh -c 'getent group libvirt-qemu >/dev/null || groupadd -r libvirt-qemu
        getent passwd libvirt-qemu >/dev/null || useradd -r -g libvirt-qemu -d /var/lib/libvirt libvirt-qemu'

    # qemu.conf: QEMU runs as root without a security driver; namespaces = [ ] because the
    # chroot cannot make its mounts private ("Failed disable mount propagation out of the
    # root filesystem"); cgroup_controllers = [ ] so libvirt leaves the host's cgroups alone;
    # swtpm (a guest's emulated TPM) runs as root too, like QEMU here.
    # (Debian 12 ships these files in libvirt-daemon-system, which is not installed, so they
    # only hold these settings; everything else keeps libvirt's built-in defaults.)
    {
        echo '# bigfleet qemu tier (scripts/qemu-tier/run.sh)'
        echo 'user = "root"'
        echo 'group = "root"'
        echo 'security_driver = "none"'
        echo 'namespaces = [ ]'
        echo 'cgroup_controllers = [ ]'
        echo 'swtpm_user = "root"'
        echo 'swtpm_group = "root"'
    } >"$R/etc/libvirt/qemu.conf"
    # libvirtd logs to a file (no journal in the chroot).
    {
        echo '# bigfleet qemu tier (scripts/qemu-tier/run.sh)'
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

# Whether any zone's libvirtd or the Ceph cluster (ceph.sh) runs (the chroot under them
# must not change then).
tier_running() {
    local z
    for z in "${zones[@]}"; do
        in_zone "$z" chroot_pid libvirtd >/dev/null && return 0
    done
    ceph_running
}

cmd_prepare() {
    local started=$SECONDS
    if ! prepared; then
        tier_running && die "the tier is running with an outdated chroot; run: $0 stop"
        # Zones (and the Ceph cluster's root) mounted on the old chroot go with it.
        unmount_zones
        ceph_unmount
    fi
    if ! base_ready; then
        rm -f "$R/guest/.bigfleet-guest" 2>/dev/null || true
        build_base
    fi
    if ! guest_ready; then
        build_guest
    fi
    if ! image_ready; then
        build_image
    fi
    say "prepared $R ($((SECONDS - started))s)"
}
