#!/usr/bin/env bash
# The real-QEMU tier's golden image: a Debian 12 disk built from Debian's packages only,
# with its own boot loader (GRUB for BIOS and UEFI on one disk), systemd, cloud-init,
# qemu-guest-agent and the bigfleet hooks (scripts/qemu-tier/image/). `prepare` builds it
# once and caches it in the chroot's /guest (a stamp over the recipe and the files, like the
# guest's); `start` puts it into zone c's pool. docs/golden-image.md is the same recipe for
# operators.
# Sourced by scripts/qemu-tier/run.sh (not run on its own), after common.sh.
# shellcheck disable=SC2154 # the lowercase settings (tier_dir, repo, ...) are set in common.sh and run.sh

# The image's packages, on top of debootstrap's minbase. Debian's cloud kernel: it drives
# virtio (the root disk, the NIC, the agent's port and the NoCloud seed, which the provider
# attaches as a virtio disk by default) and little else, so it boots faster than the generic
# kernel; it has no AHCI driver, so this image cannot read a seed on `--seed-bus sata`.
# cloud-guest-utils and fdisk let cloud-init grow the root partition to the overlay's size.
image_packages=(linux-image-cloud-amd64 systemd systemd-sysv udev dbus cloud-init
    cloud-guest-utils fdisk e2fsprogs qemu-guest-agent iproute2)
# The tier's additions, for its Ignition walk only (image/bigfleet-ignition.service): Debian's
# Ignition engine, and setfiles, which that engine runs after writing files.
image_tier_packages=(ignition policycoreutils)
# The tier's own changes to the image, which the recipe for operators (docs/golden-image.md)
# does not make: units a tier guest never needs, masked so that they do not take the one
# vCPU while the guest boots under software emulation. e2scrub_reap removes stale e2scrub
# LVM snapshots (the image has no LVM) and took 10–20 s of CPU at every TCG boot;
# systemd-fsck-root checks the root file system of a fresh overlay of an image built clean,
# 1.5–3.3 s under TCG before cloud-init (and so the agent) can start;
# systemd-networkd-wait-online holds network-online.target (and cloud-init's network stage
# after it) until a link is up or 2 minutes pass, and the qemu_ceph guests boot in zones
# without a NIC, where that was 110 s of every boot (the tier's guests need no network to be
# up before cloud-init: their seed is a local disk). A real node keeps all three. The rest
# compete for the vCPU while udev brings up the agent's port and cloud-init starts, and a
# tier guest uses none of them: the boot record in wtmp, binfmt handlers, the debug and
# tracing file systems. systemd-sysusers creates system users the image's packages already
# made when it was built, and sat 0.6 s on the agent's critical chain (before
# local-fs-pre.target).
image_tier_masks=(e2scrub_reap.service systemd-fsck-root.service systemd-networkd-wait-online.service
    systemd-update-utmp.service systemd-binfmt.service sys-kernel-debug.mount sys-kernel-tracing.mount
    systemd-sysusers.service)
# Generators a tier guest has nothing for (encrypted, integrity and verity volumes,
# hibernation, GPT auto-mounts, offline updates, SysV scripts, rc.local, the kernel command
# line's debug and run options), masked by a link to /dev/null in
# /etc/systemd/system-generators: systemd runs every generator before it loads a unit, and
# under TCG each cost 150-300 ms of the one vCPU (2.9 s from systemd's start to its first
# job with all of them). fstab, getty and cloud-init's stay.
image_tier_generators=(systemd-cryptsetup-generator systemd-integritysetup-generator
    systemd-veritysetup-generator systemd-hibernate-resume-generator systemd-gpt-auto-generator
    systemd-system-update-generator systemd-sysv-generator systemd-rc-local-generator
    systemd-debug-generator systemd-run-generator)
# The initramfs's modules (image/initramfs.conf): the root disk's drivers, and the agent's
# port, so that it exists before systemd starts (image/qemu-guest-agent.service).
image_initramfs_modules=(virtio_pci virtio_blk virtio_console)
# Bump when the image recipe changes in a way the stamp cannot see.
image_recipe=2
# The image inside the chroot (so in every zone), and its volume name in zone c's pool.
real_image=debian-12-bigfleet.qcow2
image_file=/guest/$real_image
image_marker=$R/guest/.bigfleet-image
# Where it is built (inside the chroot, where the disk tools are); removed afterwards.
image_work=/image

image_stamp() {
    { base_stamp; printf '%s\n' "$image_recipe" "${image_packages[@]}" "${image_tier_packages[@]}" "${image_tier_masks[@]}" \
        "${image_tier_generators[@]}" "${image_initramfs_modules[@]}"; cat "$guest_src"/image/*; } \
        | sha256sum | cut -c1-16
}
image_ready() {
    [[ -f $image_marker && $(cat "$image_marker") == "$(image_stamp)" && -s $R$image_file ]]
}

# Runs "$@" with R pointing at the image's root file system (mount_chroot, in_chroot and
# unmount_chroot then work on it).
in_image_root() {
    local R=$R$image_work/root
    "$@"
}

# debootstrap, the packages, the hooks and units, inside $R$image_work/root.
image_rootfs() {
    local root=$R$image_work/root src=$guest_src/image
    say "image: debootstrap --variant=minbase $suite"
    debootstrap --variant=minbase "$suite" "$root" "$(mirror)" >"$tier_dir/image-debootstrap.log" 2>&1 \
        || { tail -n 20 "$tier_dir/image-debootstrap.log" >&2; die "debootstrap of the image failed (log: $tier_dir/image-debootstrap.log)"; }
    if [[ -z ${QEMU_TIER_MIRROR:-} && -r /etc/apt/sources.list.d/debian.sources ]]; then
        cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/"
        rm -f "$root/etc/apt/sources.list"
    fi
    cp -L /etc/resolv.conf "$root/etc/resolv.conf"
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
    chmod 755 "$root/usr/sbin/policy-rc.d"
    install -m 0644 "$src/nodoc" "$root/etc/dpkg/dpkg.cfg.d/01-bigfleet-nodoc"
    in_image_root mount_chroot
    in_image_root in_chroot apt-get update -q >"$tier_dir/image-apt.log" 2>&1 \
        || { tail -n 20 "$tier_dir/image-apt.log" >&2; die "apt-get update in the image failed"; }
    in_image_root in_chroot apt-get install -y -q --no-install-recommends "${image_packages[@]}" "${image_tier_packages[@]}" \
        >>"$tier_dir/image-apt.log" 2>&1 \
        || { tail -n 20 "$tier_dir/image-apt.log" >&2; die "apt-get install in the image failed (log: $tier_dir/image-apt.log)"; }
    in_image_root in_chroot apt-get clean
    install -d "$root/opt/bigfleet"
    install -m 0755 "$src/bootstrap" "$src/drain" "$src/join" "$src/ignition" "$root/opt/bigfleet/"
    install -m 0644 "$src/bigfleet-join.service" "$src/bigfleet-ignition.service" "$root/etc/systemd/system/"
    in_image_root in_chroot systemctl enable bigfleet-ignition.service >/dev/null 2>&1
    install -m 0644 "$src/selinux-config" "$root/etc/selinux/config"
    install -d "$root/etc/selinux/bigfleet/contexts/files"
    : >"$root/etc/selinux/bigfleet/contexts/files/file_contexts"
    install -m 0644 "$src/qemu-guest-agent.service" "$root/etc/systemd/system/"
    in_image_root in_chroot systemctl enable qemu-guest-agent.service >/dev/null 2>&1
    install -m 0644 "$src/90-bigfleet.cfg" "$root/etc/cloud/cloud.cfg.d/"
    install -m 0644 "$src/ds-identify.cfg" "$root/etc/cloud/ds-identify.cfg"
    install -m 0644 "$src/80-dhcp.network" "$root/etc/systemd/network/"
    in_image_root in_chroot systemctl enable systemd-networkd.service >/dev/null 2>&1
    install -m 0644 "$src/initramfs.conf" "$root/etc/initramfs-tools/conf.d/bigfleet.conf"
    printf '%s\n' "${image_initramfs_modules[@]}" >>"$root/etc/initramfs-tools/modules"
    in_image_root in_chroot update-initramfs -u -k all >>"$tier_dir/image-apt.log" 2>&1 \
        || { tail -n 20 "$tier_dir/image-apt.log" >&2; die "update-initramfs in the image failed (log: $tier_dir/image-apt.log)"; }
    in_image_root in_chroot systemctl mask "${image_tier_masks[@]}" >/dev/null 2>&1
    install -d "$root/etc/systemd/system-generators"
    local generator
    for generator in "${image_tier_generators[@]}"; do
        ln -sf /dev/null "$root/etc/systemd/system-generators/$generator"
    done
    echo 'LABEL=bigfleet-root / ext4 defaults,errors=remount-ro 0 1' >"$root/etc/fstab"
    # Per-machine state a golden image must not carry: each boot makes its own.
    : >"$root/etc/machine-id"
    rm -f "$root/var/lib/dbus/machine-id" "$root/usr/sbin/policy-rc.d"
    : >"$root/etc/resolv.conf"
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/log/*.log "$root/var/cache/debconf"/*-old
    in_image_root unmount_chroot
}

# Debian's signed UEFI loaders for the image's EFI system partition (image/assemble): shim,
# signed by the UEFI CA whose key OVMF's Secure Boot build has enrolled, and GRUB, signed by
# Debian, which shim trusts; GRUB then checks the kernel's signature through shim. The
# packages are only unpacked into $image_work/signed, not installed: their maintainer
# scripts would try to install a boot loader into the chroot.
signed_loaders() {
    local dir=$image_work/signed
    mkdir -p "$R$dir"
    local get="cd $dir && apt-get download -q shim-signed grub-efi-amd64-signed"
    if ! in_chroot sh -c "$get" >>"$tier_dir/image-apt.log" 2>&1; then
        in_chroot apt-get update -q >>"$tier_dir/image-apt.log" 2>&1 \
            || die "apt-get update in the chroot failed (log: $tier_dir/image-apt.log)"
        in_chroot sh -c "$get" >>"$tier_dir/image-apt.log" 2>&1 \
            || die "cannot download shim-signed and grub-efi-amd64-signed (log: $tier_dir/image-apt.log)"
    fi
    in_chroot sh -c "cd $dir && for deb in *.deb; do dpkg-deb -x \"\$deb\" .; done" \
        || die "cannot unpack the signed loaders"
}

build_image() {
    local started=$SECONDS
    mount_chroot
    if [[ -e $R$image_work ]]; then
        in_image_root unmount_chroot
        rm -rf --one-file-system "${R:?}$image_work"
    fi
    mkdir -p "$R$image_work/src"
    image_rootfs
    say "image: root file system: $((SECONDS - started))s"
    signed_loaders
    cp "$guest_src/image/assemble" "$R$image_work/src/"
    rm -f "$R$image_file" "$image_marker"
    in_chroot /bin/bash "$image_work/src/assemble" "$image_file" || die "assembling the image failed"
    rm -rf --one-file-system "${R:?}$image_work"
    image_stamp >"$image_marker"
    say "image: $image_file built in $((SECONDS - started))s"
}

# Zone c's copy of the image in its pool (at $R = zone c's root), unless it has it.
ensure_real_image() {
    # The stamp sits outside the pool (every file in a dir pool is a volume).
    local target=$R$pool_dir/$real_image stamp=$R/var/lib/libvirt/.bigfleet-image
    if [[ ! -f $target || $(cat "$stamp" 2>/dev/null) != "$(image_stamp)" ]]; then
        cp --reflink=auto "$R$image_file" "$R/var/lib/libvirt/$real_image.tmp"
        mv "$R/var/lib/libvirt/$real_image.tmp" "$target"
        image_stamp >"$stamp"
    fi
    virsh_ pool-refresh "$pool" >/dev/null
}
