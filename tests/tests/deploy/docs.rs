//! The documented examples work as written: the example values file is the install
//! guide's, every command of deploy/README.md renders or runs, and the credential Secret
//! examples validate.

use std::path::Path;

use super::*;

#[test]
fn example_values_file_matches_the_install_guide() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    let (_dir, guide) = temp_file("dc1.values.yaml", GUIDE_VALUES);
    let ours = tools.render(&["-f", "deploy/examples/dc1.values.yaml"]);
    let theirs = tools.render(&["-f", &guide]);
    assert_eq!(ours.yaml, theirs.yaml);
    assert!(Path::new(&repo_root().join("deploy/README.md")).is_file());
}

/// The shell commands of deploy/README.md (its indented blocks), continuation lines joined.
fn readme_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(repo_root().join("deploy/README.md")).unwrap();
    let mut commands = Vec::new();
    let mut current = String::new();
    for line in readme.lines() {
        let Some(code) = line.strip_prefix("    ") else {
            continue;
        };
        let code = code.trim();
        match code.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(code);
                commands.push(std::mem::take(&mut current));
            }
        }
    }
    commands
}

/// Every `helm install` in deploy/README.md renders (as `helm template`, same arguments) and
/// validates, and names a Deployment the README's kubectl commands then use.
#[test]
fn readme_helm_install_commands_render() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    let installs: Vec<String> = readme_commands()
        .into_iter()
        .filter(|c| c.starts_with("helm install "))
        .collect();
    assert!(!installs.is_empty(), "deploy/README.md shows helm install");
    for install in &installs {
        let words: Vec<&str> = install.split_whitespace().collect();
        assert_eq!(words[2], RELEASE, "{install}");
        assert_eq!(words[3], "deploy/helm", "{install}");
        let mut args = vec!["template"];
        args.extend_from_slice(&words[2..]);
        let (ok, yaml, stderr) = tools.run("helm", &args);
        assert!(ok, "{install}:\n{stderr}");
        tools.validate(&yaml, &args);
        assert!(yaml.contains(&format!("name: {RELEASE}\n")), "{install}");
        assert!(
            yaml.contains(&format!("namespace: {NAMESPACE}\n")),
            "{install}"
        );
    }
    let commands = readme_commands();
    let logs =
        format!("kubectl -n {NAMESPACE} logs deploy/{RELEASE} | grep 'serving CapacityProvider'");
    assert!(commands.contains(&logs), "README shows: {logs}");
}

/// The README's dry-run command (`cargo run ... offerings ...`) works as written.
#[test]
fn readme_dry_run_command_works() {
    let command = readme_commands()
        .into_iter()
        .find(|c| c.starts_with("cargo run --bin bigfleet-libvirt -- offerings"))
        .expect("deploy/README.md shows the cargo dry run");
    let args: Vec<String> = command
        .split_whitespace()
        .skip(6)
        .map(str::to_owned)
        .collect();
    let (ok, stderr) = binary_with_chart_args(&args, &[]);
    assert!(ok, "{command}: {stderr}");
}

#[test]
fn credential_secret_examples_validate() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    let path = "deploy/examples/libvirt-credentials.example.yaml";
    let yaml = std::fs::read_to_string(repo_root().join(path)).unwrap();
    tools.validate(&yaml, &[path]);
    for name in [
        "name: bigfleet-libvirt-ssh\n",
        "name: bigfleet-libvirt-tls\n",
        "name: bigfleet-libvirt-tls-grpc\n",
        "type: kubernetes.io/tls\n",
    ] {
        assert!(yaml.contains(name), "{path} has {name}");
    }
    for key in [
        "id_ed25519:",
        "known_hosts:",
        "clientcert.pem:",
        "clientkey.pem:",
        "cacert.pem:",
        "tls.crt:",
        "tls.key:",
        "ca.crt:",
    ] {
        assert!(yaml.contains(key), "{path} has {key}");
    }
}
