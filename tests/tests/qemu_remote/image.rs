//! `image_remote_doctor`: the runtime tree `deploy/stage-runtime.sh` assembles (the image's
//! contents, see tests/tests/image.rs), run as uid 65532 in a chroot, passes `doctor`
//! against both remote zones, with the SSH and TLS Secrets laid out where and how the chart
//! mounts them.

use std::fs::{Permissions, set_permissions};
use std::os::unix::fs::{PermissionsExt, chown, symlink};

use super::*;
use crate::image::Tree;

/// The image's user and group (`USER 65532:65532`; the chart's `fsGroup`).
const NONROOT: u32 = 65532;

/// Lays `files` out at `dir` inside the tree as a Secret volume of the chart
/// (deploy/helm/templates/deployment.yaml: `defaultMode: 0440`; deploy/helm/values.yaml:
/// `fsGroup: 65532`), modelled on the kubelet's layout: each name a symlink through `..data`
/// to a timestamped directory holding the files, root-owned, group 65532, mode 0440.
fn mount_secret(root: &Path, dir: &str, files: &[(&str, PathBuf)]) {
    let at = root.join(dir.trim_start_matches('/'));
    let stamp = at.join("..2026_12_02_00_00_00.000000001");
    std::fs::create_dir_all(&stamp).unwrap();
    for (name, from) in files {
        let to = stamp.join(name);
        std::fs::copy(from, &to).unwrap();
        chown(&to, Some(0), Some(NONROOT)).unwrap();
        set_permissions(&to, Permissions::from_mode(0o440)).unwrap();
        symlink(format!("..data/{name}"), at.join(name)).unwrap();
    }
    symlink(stamp.file_name().unwrap(), at.join("..data")).unwrap();
    for (d, mode) in [(&at, 0o1777), (&stamp, 0o755)] {
        chown(d, Some(0), Some(NONROOT)).unwrap();
        set_permissions(d, Permissions::from_mode(mode)).unwrap();
    }
}

/// What the distroless base layer and the pod add around the staged tree: the nonroot
/// user (`/etc/passwd`, its home), the kubelet's `/etc/hosts`, and the chart's `/tmp`.
fn base_files(root: &Path) {
    let etc = root.join("etc");
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::write(
        etc.join("passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    )
    .unwrap();
    std::fs::write(etc.join("group"), "root:x:0:\nnonroot:x:65532:\n").unwrap();
    std::fs::write(etc.join("hosts"), "127.0.0.1\tlocalhost\n::1\tlocalhost\n").unwrap();
    let home = root.join("home/nonroot");
    std::fs::create_dir_all(&home).unwrap();
    chown(&home, Some(NONROOT), Some(NONROOT)).unwrap();
    let tmp = root.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    set_permissions(&tmp, Permissions::from_mode(0o1777)).unwrap();
}

#[test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
fn image_remote_doctor() {
    let tree = Tree::stage().expect("the real-QEMU tier runs as root");
    base_files(&tree.root);
    let creds = PathBuf::from(var("BIGFLEET_QEMU_CREDS"));
    let ssh = ["id_ed25519", "known_hosts"].map(|f| (f, creds.join("ssh").join(f)));
    mount_secret(&tree.root, "/etc/bigfleet/libvirt-ssh", &ssh);
    let tls = ["cacert.pem", "clientcert.pem", "clientkey.pem"];
    mount_secret(
        &tree.root,
        "/etc/bigfleet/libvirt-tls",
        &tls.map(|f| (f, creds.join("tls").join(f))),
    );
    let (types, offerings) = (
        "/etc/bigfleet/instance-types/instance-types.json",
        "/etc/bigfleet/offerings/offerings.json",
    );
    for f in [types, offerings] {
        std::fs::create_dir_all(tree.root.join(&f[1..]).parent().unwrap()).unwrap();
    }
    write_doctor_files(
        &tree.root.join(&types[1..]),
        &tree.root.join(&offerings[1..]),
    );
    let keys = Path::new("/etc/bigfleet/libvirt-ssh");
    let connect = format!(
        "rackA={},rackB={}",
        Creds::ssh_uri_with(&keys.join("id_ed25519"), &keys.join("known_hosts")),
        Creds::tls_uri_with("localhost", Path::new("/etc/bigfleet/libvirt-tls"))
    );
    let (code, report) = run_doctor(tree.command().args(doctor_args(&connect, types, offerings)));
    for zone in ["rackA", "rackB"] {
        let check = connection(&report, zone);
        println!("image, uid 65532: {check}");
        assert_eq!(check["status"], "ok", "{check}");
    }
    let blocks: Vec<&Value> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "block")
        .collect();
    assert!(blocks.is_empty(), "blocking checks: {blocks:#?}");
    assert_ne!(code, 1, "{report:#}");
}
