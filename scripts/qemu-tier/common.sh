#!/usr/bin/env bash
# The real-QEMU tier's settings and small helpers: where the chroot and the zones live, what
# goes into them, and running commands in a zone or its chroot. Sourced first by
# scripts/qemu-tier/run.sh (not run on its own); the other parts read these settings.
# shellcheck disable=SC2034,SC2154 # settings used only by the other parts look unused here; repo and guest_src are set by run.sh

tier_dir=$(realpath -m "${QEMU_TIER_DIR:-/var/tmp/bigfleet-qemu-tier}")
R=$tier_dir/bookworm

suite=bookworm
# Packages installed in the chroot (the daemon, QEMU, the tools, and the guest's parts; for
# the remote zones, sshd, polkit and its system bus, and nc for libvirt's remote helper; for
# the image zone's NAT network, dnsmasq, iptables and iproute2; and the tools that lay out
# the golden image's disk without loop devices: sfdisk, mkfs.vfat, mtools and GRUB's images;
# for the single-node Ceph cluster (ceph.sh), its daemons and CLI, libvirt's rbd storage
# backend and QEMU's rbd block driver; swtpm for the guests' emulated TPMs).
chroot_packages=(libvirt-daemon libvirt-daemon-driver-qemu qemu-system-x86 qemu-utils
    libvirt-clients qemu-guest-agent busybox-static cpio kmod ovmf
    openssh-server polkitd dbus netcat-openbsd
    dnsmasq-base iptables iproute2
    fdisk dosfstools mtools e2fsprogs grub-pc-bin grub-efi-amd64-bin
    ceph-mon ceph-osd ceph-mgr ceph-common libvirt-daemon-driver-storage-rbd qemu-block-extra
    swtpm swtpm-tools)
# Bump when the chroot recipe changes in a way that needs a fresh debootstrap. A change of
# the package list alone that only adds packages does not: prepare installs the new ones
# into the existing chroot (chroot.sh).
base_recipe=2
# The zones: overlay mounts of the chroot, one libvirtd each. Zone c is the image zone: its
# libvirtd runs in a network namespace with a NAT network (network.sh).
zones=(a b c)
image_zone=c

pool=bigfleet
pool_dir=/var/lib/libvirt/images/bigfleet
image=golden.qcow2
image_size=256M
kernel=/guest/vmlinuz
initrd=/guest/initrd.img
cmdline='console=ttyS0 panic=-1'

# Markers: the base chroot (debootstrap + packages + daemon config), what its debootstrap
# was made by (recipe and suite) and the packages installed on it, and the guest build.
base_marker=$R/.bigfleet-base
bootstrap_marker=$R/.bigfleet-debootstrap
packages_marker=$R/.bigfleet-packages
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
    local netns
    mapfile -t netns < <(netns_prefix)
    "${netns[@]}" chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 \
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

bootstrap_stamp() { printf '%s\n' "$base_recipe" "$suite"; }
base_stamp() { printf '%s\n' "$base_recipe" "$suite" "${chroot_packages[@]}" | sha256sum | cut -c1-16; }

# The guest stamp covers the guest files' content (init, hooks, build script) and the base.
guest_stamp() {
    { base_stamp; cat "$guest_src"/init "$guest_src"/bootstrap "$guest_src"/drain \
        "$guest_src"/shutdown "$guest_src"/build-initramfs; } | sha256sum | cut -c1-16
}

base_ready() { [[ -f $base_marker && $(cat "$base_marker") == "$(base_stamp)" ]]; }
# The image (image.sh) is part of what prepare makes.
prepared() { base_ready && guest_ready && image_ready; }
guest_ready() {
    [[ -f $guest_marker && $(cat "$guest_marker") == "$(guest_stamp)" && -s $R$kernel && -s $R$initrd ]]
}

# One mutating subcommand at a time (prepare/start/stop/ci share the chroot). The lock is
# fd 9; the daemons are started with it closed so they never hold it.
lock() {
    mkdir -p "$tier_dir"
    exec 9>"$tier_dir/.lock"
    flock -w 600 9 || die "another qemu-tier/run.sh holds $tier_dir/.lock"
}
