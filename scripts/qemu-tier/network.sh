#!/usr/bin/env bash
# The real-QEMU tier's image zone, c: its libvirtd runs in a network namespace the tier makes,
# with libvirt's NAT network `default` (a bridge, libvirt's dnsmasq for DHCP, iptables NAT),
# so the guests booted from the golden image get a real NIC, a DHCP lease and an address
# while nothing of it touches the host's network. Zone c, not a or b: zone b is reached over
# TLS on the host's 127.0.0.1 (a daemon in a namespace listens on the namespace's loopback),
# and keeping a and b as they were keeps their scenarios as they were. The tests reach zone
# c's daemon through its unix socket, which is a file and so reachable from any namespace.
# Sourced by scripts/qemu-tier/run.sh (not run on its own), after common.sh.
# shellcheck disable=SC2154 # the lowercase settings (tier_dir, pool, ...) are set in common.sh

# The namespace's name, from the tier directory (two tiers never share one).
netns_name() { echo "bigfleet-tier-$(printf '%s' "$tier_dir" | cksum | cut -d' ' -f1)"; }

# Whether $R is the image zone's root (whose processes run in the namespace).
in_image_zone() { [[ $R == "$(zone_root "$image_zone")" ]]; }

# The command prefix that runs a command in the namespace, for the image zone only.
netns_prefix() {
    if in_image_zone; then
        printf '%s\n' nsenter "--net=/run/netns/$(netns_name)"
    fi
}

ensure_netns() {
    local ns
    ns=$(netns_name)
    [[ -e /run/netns/$ns ]] || ip netns add "$ns" || die "cannot create the network namespace $ns"
    ip -n "$ns" link set lo up
}

remove_netns() {
    local ns
    ns=$(netns_name)
    [[ -e /run/netns/$ns ]] || return 0
    ip netns delete "$ns" || say "cannot delete the network namespace $ns"
}

# The zone's libvirt network `default` (defined once, started when inactive), and the
# user libvirt runs its dnsmasq as. The subnet is libvirt's usual one: it lives only in
# the namespace. dnsmasq runs with no-ping: before it offers an address it would otherwise
# ping it and wait up to 3 s for an answer, at every boot (each fresh overlay is a new DHCP
# client), and the guest's cloud-init network stage, and so its agent, waits for the lease;
# on this namespace's network only the tier's guests hold addresses, and dnsmasq leases them.
ensure_network() {
    in_chroot sh -c 'getent group libvirt-dnsmasq >/dev/null || groupadd -r libvirt-dnsmasq
        getent passwd libvirt-dnsmasq >/dev/null \
            || useradd -r -g libvirt-dnsmasq -d /var/lib/libvirt/dnsmasq -s /usr/sbin/nologin libvirt-dnsmasq'
    if ! virsh_ net-info default >/dev/null 2>&1; then
        cat >"$R/etc/libvirt/default-network.xml" <<'XML'
<network xmlns:dnsmasq='http://libvirt.org/schemas/network/dnsmasq/1.0'>
  <name>default</name>
  <forward mode='nat'/>
  <bridge name='virbr0' stp='on' delay='0'/>
  <ip address='192.168.122.1' netmask='255.255.255.0'>
    <dhcp>
      <range start='192.168.122.2' end='192.168.122.254'/>
    </dhcp>
  </ip>
  <dnsmasq:options>
    <dnsmasq:option value='no-ping'/>
  </dnsmasq:options>
</network>
XML
        virsh_ net-define /etc/libvirt/default-network.xml >/dev/null
    fi
    start_network default
    # `static`: an isolated network with no DHCP (no <dhcp>, no <forward>), for the guests
    # that take a fixed address from a static address pool (qemu_image::network): its bridge
    # virbr1 holds 192.168.123.1 in the namespace, so the test can ping the guest from there.
    if ! virsh_ net-info static >/dev/null 2>&1; then
        cat >"$R/etc/libvirt/static-network.xml" <<'XML'
<network>
  <name>static</name>
  <bridge name='virbr1' stp='on' delay='0'/>
  <ip address='192.168.123.1' netmask='255.255.255.0'/>
</network>
XML
        virsh_ net-define /etc/libvirt/static-network.xml >/dev/null
    fi
    start_network static
}

# Starts the zone's libvirt network $1 when it is inactive.
start_network() {
    local info
    info=$(virsh_ net-info "$1")
    if ! grep -Eq '^Active:[[:space:]]+yes' <<<"$info"; then
        virsh_ net-start "$1" >/dev/null \
            || die "cannot start zone $image_zone's network $1 (log: $R/var/log/libvirt/libvirtd.log)"
    fi
}

# Whether QEMU in the image zone can run guests on KVM: "yes", or "no: <why>". First
# KVM_CREATE_VM (what fails where /dev/kvm is missing or unusable; QEMU makes it at start),
# then a real boot: the tier's small guest must reach its init within 40 s. The second
# step is needed because a /dev/kvm that creates VMs may still not run them (on a nested or
# software "KVM" such as kvm_pvm, firmware and early boot code can stall for minutes).
kvm_probe() {
    [[ -c $R/dev/kvm ]] || { echo "no: no /dev/kvm"; return; }
    local out
    if ! out=$(echo quit | in_chroot timeout 30 qemu-system-x86_64 -accel kvm -machine none \
        -nodefaults -display none -monitor stdio 2>&1); then
        echo "no: KVM_CREATE_VM fails: $(tail -n 1 <<<"$out")"
        return
    fi
    local log=$R/tmp/kvm-probe.log pid i
    rm -f "$log"
    in_chroot timeout 45 qemu-system-x86_64 -accel kvm -machine q35 -cpu qemu64,-svm -m 256 \
        -nodefaults -display none -no-reboot -kernel "$kernel" -initrd "$initrd" \
        -append "$cmdline" -serial file:/tmp/kvm-probe.log </dev/null >/dev/null 2>&1 9>&- &
    pid=$!
    for ((i = 0; i < 400; i++)); do
        grep -q 'bigfleet-init' "$log" 2>/dev/null && break
        [[ -d /proc/$pid ]] || break
        sleep 0.1
    done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    if grep -q 'bigfleet-init' "$log" 2>/dev/null; then
        echo yes
    elif [[ -s $log ]]; then
        echo "no: KVM_CREATE_VM works, but a KVM guest did not reach its init within 40 s"
    else
        echo "no: KVM_CREATE_VM works, but a KVM guest printed nothing within 40 s (firmware and early boot stall: nested or software KVM, $(kvm_module))"
    fi
}

# kvm_probe's answer in $tier_dir/zone-c/kvm, probed once per host boot (the probe takes
# 40 s where KVM stalls; what the host offers does not change while it runs).
cached_kvm_probe() {
    local file boot
    file=$(zone_dir "$image_zone")/kvm
    boot=$(cat /proc/sys/kernel/random/boot_id)
    if [[ $(cat "$file.boot" 2>/dev/null) != "$boot" || ! -s $file ]]; then
        kvm_probe >"$file"
        echo "$boot" >"$file.boot"
    fi
}

# The host's KVM module(s), for the probe's message.
kvm_module() {
    local m found=()
    for m in kvm_intel kvm_amd kvm_pvm; do [[ -d /sys/module/$m ]] && found+=("$m"); done
    echo "${found[*]:-no vendor module}"
}
