#!/usr/bin/env bash
# The real-QEMU tier's remote transports: zone a is reached over qemu+libssh:// through a
# real OpenSSH sshd as the non-root user bigfleet (in the libvirt group, allowed by
# deploy/examples/49-bigfleet-libvirt.rules through a real polkitd on its own system bus),
# zone b over qemu+tls:// to its libvirtd listening for TLS with a server certificate from
# a CA the tier makes, tls_allowed_dn_list set to the client certificate's DN. Both listen
# on 127.0.0.1 only, on ports derived from QEMU_TIER_DIR (so two tiers never share one).
# The provider's credentials sit on the host in $tier_dir/creds (ssh/ and tls/, laid out as
# the chart mounts its Secrets); the CA that signs the certificates in $tier_dir/ca.
# Sourced by scripts/qemu-tier/run.sh (not run on its own), after common.sh.
# shellcheck disable=SC2154 # the lowercase settings (tier_dir, repo, ...) are set in common.sh and run.sh

creds_dir=$tier_dir/creds
ca_dir=$tier_dir/ca
# The DN libvirtd's tls_allowed_dn_list holds, as gnutls prints the client certificate's.
client_dn='O=BigFleet,CN=bigfleet-libvirt-client'

# Two free-looking ports from a hash of the tier directory (20000..39999, even base).
port_base() {
    local sum
    sum=$(printf '%s' "$tier_dir" | cksum | cut -d' ' -f1)
    echo $((20000 + (sum % 10000) * 2))
}
ssh_port=$(port_base)
tls_port=$((ssh_port + 1))

ssh_uri() {
    echo "qemu+libssh://bigfleet@127.0.0.1:$ssh_port/system?keyfile=$creds_dir/ssh/id_ed25519&known_hosts=$creds_dir/ssh/known_hosts&known_hosts_verify=normal"
}
tls_uri() { echo "qemu+tls://localhost:$tls_port/system?pkipath=$creds_dir/tls"; }

# --- zone a: sshd, polkit, the bigfleet user ------------------------------------------------

# The bigfleet user exactly as deploy/README.md step 2 A makes it, with the provider's key
# authorised (made once per tier, kept in $creds_dir/ssh).
setup_ssh_user() {
    in_chroot sh -c 'getent group libvirt >/dev/null || groupadd -r libvirt
        getent passwd bigfleet >/dev/null || useradd --create-home --shell /bin/sh bigfleet
        usermod -aG libvirt bigfleet
        usermod -p "*" bigfleet
        install -d -m 0700 -o bigfleet -g bigfleet /home/bigfleet/.ssh'
    mkdir -p "$creds_dir/ssh"
    chmod 0700 "$creds_dir" "$creds_dir/ssh"
    if [[ ! -s $creds_dir/ssh/id_ed25519 ]]; then
        rm -f "$R/root/tier-key" "$R/root/tier-key.pub"
        in_chroot ssh-keygen -q -t ed25519 -N '' -C bigfleet-libvirt -f /root/tier-key
        mv "$R/root/tier-key" "$creds_dir/ssh/id_ed25519"
        mv "$R/root/tier-key.pub" "$creds_dir/ssh/id_ed25519.pub"
    fi
    local keys=$R/home/bigfleet/.ssh/authorized_keys
    echo "from=\"127.0.0.1\",no-agent-forwarding,no-X11-forwarding $(cat "$creds_dir/ssh/id_ed25519.pub")" >"$keys"
    in_chroot sh -c 'chown bigfleet:bigfleet /home/bigfleet/.ssh/authorized_keys
        chmod 0600 /home/bigfleet/.ssh/authorized_keys'
    install -m 0644 "$repo/deploy/examples/49-bigfleet-libvirt.rules" "$R/etc/polkit-1/rules.d/"
    write_polkit_actions
}

# The polkit actions libvirtd asks about. A host's libvirt-daemon-system package ships
# them; the chroot does not install that package (its services want systemd), so the tier
# declares the two actions itself: by default only an administrator is allowed, and the
# rule above is what lets bigfleet in.
write_polkit_actions() {
    local action description
    mkdir -p "$R/usr/share/polkit-1/actions"
    {
        echo '<?xml version="1.0" encoding="UTF-8"?>'
        echo '<!DOCTYPE policyconfig PUBLIC "-//freedesktop//DTD PolicyKit Policy Configuration 1.0//EN"'
        echo ' "http://www.freedesktop.org/standards/PolicyKit/1.0/policyconfig.dtd">'
        echo '<policyconfig>'
        for action in monitor manage; do
            description="libvirt: $action local virtualized systems (bigfleet qemu tier)"
            echo "  <action id=\"org.libvirt.unix.$action\">"
            echo "    <description>$description</description>"
            echo "    <message>$description</message>"
            echo '    <defaults><allow_any>auth_admin_keep</allow_any><allow_inactive>auth_admin_keep</allow_inactive><allow_active>auth_admin_keep</allow_active></defaults>'
            echo '  </action>'
        done
        echo '</policyconfig>'
    } >"$R/usr/share/polkit-1/actions/org.libvirt.unix.policy"
}

# sshd on 127.0.0.1:$ssh_port, keys only; known_hosts pins every host key it offers.
setup_sshd() {
    in_chroot ssh-keygen -A >/dev/null
    {
        echo '# bigfleet qemu tier (scripts/qemu-tier/remote.sh)'
        echo "Port $ssh_port"
        echo 'ListenAddress 127.0.0.1'
        echo 'PidFile /run/sshd.pid'
        echo 'PermitRootLogin no'
        echo 'PasswordAuthentication no'
        echo 'KbdInteractiveAuthentication no'
        echo 'UsePAM no'
        echo 'AllowUsers bigfleet'
    } >"$R/etc/ssh/sshd_config.d/bigfleet.conf"
    local key
    : >"$creds_dir/ssh/known_hosts"
    for key in "$R"/etc/ssh/ssh_host_*_key.pub; do
        echo "[127.0.0.1]:$ssh_port $(cut -d' ' -f1,2 "$key")" >>"$creds_dir/ssh/known_hosts"
    done
}

# The system bus, polkitd and sshd of the zone at $R (before libvirtd: it asks polkit over
# that bus). No waiting: sshd and dbus-daemon daemonize once listening.
launch_ssh_side() {
    mkdir -p "$R/run/dbus" "$R/run/sshd"
    if ! chroot_pid dbus-daemon >/dev/null; then
        rm -f "$R/run/dbus/pid" "$R/run/dbus/system_bus_socket"
        in_chroot sh -c 'dbus-daemon --system --fork --print-pid >/run/dbus-daemon.pid' 9>&-
    fi
    if ! chroot_pid polkitd >/dev/null; then
        in_chroot sh -c '/usr/lib/polkit-1/polkitd --no-debug </dev/null >/var/log/polkitd.log 2>&1 &
            echo $! >/run/polkitd.pid' 9>&-
    fi
    if ! chroot_pid sshd >/dev/null; then
        rm -f "$R/run/sshd.pid"
        in_chroot /usr/sbin/sshd -E /var/log/sshd.log 9>&- \
            || die "sshd in $R did not start (log: $R/var/log/sshd.log; port $ssh_port taken?)"
    fi
}

# --- zone b: the CA, the certificates, libvirtd listening for TLS ---------------------------

# issue NAME SUBJECT EXTENSIONS: a P-256 key and a certificate the tier's CA signs, valid 30 days.
issue() {
    local name=$1 subject=$2 ext=$3
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "$subject" \
        -keyout "$ca_dir/$name.key" -out "$ca_dir/$name.csr" 2>/dev/null
    openssl x509 -req -in "$ca_dir/$name.csr" -CA "$ca_dir/cacert.pem" -CAkey "$ca_dir/cakey.pem" \
        -CAcreateserial -days 30 -extfile <(printf '%s\n' "$ext") -out "$ca_dir/$name.pem" 2>/dev/null
    rm -f "$ca_dir/$name.csr"
}

# The CA, the server certificate (for localhost) and the provider's client certificate,
# made once per tier; the client's files go to $creds_dir/tls with libvirt's pkipath names.
setup_tls_files() {
    mkdir -p "$ca_dir" "$creds_dir/tls"
    chmod 0700 "$ca_dir" "$creds_dir" "$creds_dir/tls"
    if [[ ! -s $ca_dir/cacert.pem ]]; then
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
            -subj '/O=BigFleet/CN=bigfleet-qemu-tier CA' -keyout "$ca_dir/cakey.pem" \
            -out "$ca_dir/cacert.pem" -addext 'keyUsage=critical,keyCertSign,cRLSign' 2>/dev/null
        issue server '/O=BigFleet/CN=localhost' "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost"
        issue client '/O=BigFleet/CN=bigfleet-libvirt-client' "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
    fi
    install -m 0644 "$ca_dir/cacert.pem" "$creds_dir/tls/cacert.pem"
    install -m 0644 "$ca_dir/client.pem" "$creds_dir/tls/clientcert.pem"
    install -m 0600 "$ca_dir/client.key" "$creds_dir/tls/clientkey.pem"
    mkdir -p "$R/etc/pki/CA" "$R/etc/pki/libvirt/private"
    install -m 0644 "$ca_dir/cacert.pem" "$R/etc/pki/CA/cacert.pem"
    install -m 0644 "$ca_dir/server.pem" "$R/etc/pki/libvirt/servercert.pem"
    install -m 0600 "$ca_dir/server.key" "$R/etc/pki/libvirt/private/serverkey.pem"
}

# libvirtd.conf of the zone at $R: the tier's log settings, and TLS on 127.0.0.1 only for
# the allowed DN (deploy/README.md step 2 B). launch_libvirtd adds --listen for it.
setup_tls_conf() {
    {
        echo '# bigfleet qemu tier (scripts/qemu-tier/run.sh, remote.sh)'
        echo 'log_outputs = "3:file:/var/log/libvirt/libvirtd.log"'
        echo 'listen_tls = 1'
        echo 'listen_tcp = 0'
        echo 'listen_addr = "127.0.0.1"'
        echo "tls_port = \"$tls_port\""
        echo "tls_allowed_dn_list = [\"$client_dn\"]"
    } >"$R/etc/libvirt/libvirtd.conf"
}

# Whether the zone at $R's libvirtd listens for TLS.
listens_tls() { grep -q '^listen_tls = 1' "$R/etc/libvirt/libvirtd.conf" 2>/dev/null; }

# Makes zone $1 remote before its daemons start: a gets sshd, b gets TLS.
setup_remote_zone() {
    case $1 in
    a) setup_ssh_user && setup_sshd && launch_ssh_side ;;
    b) setup_tls_files && setup_tls_conf ;;
    esac
}

# The exports of the remote zones (cmd_env).
remote_env() {
    echo "export BIGFLEET_QEMU_SSH_URI='$(ssh_uri)'"
    echo "export BIGFLEET_QEMU_TLS_URI='$(tls_uri)'"
    echo "export BIGFLEET_QEMU_SSH_PORT='$ssh_port'"
    echo "export BIGFLEET_QEMU_TLS_PORT='$tls_port'"
    echo "export BIGFLEET_QEMU_CREDS='$creds_dir'"
    echo "export BIGFLEET_QEMU_CA='$ca_dir'"
}
