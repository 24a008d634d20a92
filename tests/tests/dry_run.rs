//! The `bigfleet-libvirt offerings` dry run (issue 8): the Speculative inventory a set of
//! flags would serve, printed as JSON without starting a server. Snapshots pin the output for
//! the built-in defaults (several `--seed-count`, `--capacity-type` and `--connect` zone
//! combinations) and for every example offerings file in `deploy/examples/`; bad input exits
//! non-zero with one line naming the flag to fix.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::harness::binary;

fn repo_root() -> PathBuf {
    crate::harness::repo_root()
}

/// Runs `bigfleet-libvirt offerings <args>` from the repository root, with none of the
/// `BIGFLEET_LIBVIRT_*` variables of the test's environment, and fails the test if it has not
/// exited within 30 s (a dry run must never start serving).
fn run(args: &[&str]) -> Output {
    run_with_env(args, &[])
}

/// [`run`], with `env` set on top.
fn run_with_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(binary());
    command
        .arg("offerings")
        .args(args)
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("RUST_LOG");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("BIGFLEET_LIBVIRT_") {
            command.env_remove(name);
        }
    }
    command.envs(env.iter().copied());
    let mut child = command.spawn().expect("spawn bigfleet-libvirt offerings");
    let start = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!(
                "`bigfleet-libvirt offerings {args:?}` still runs after 30 s: a dry run must exit"
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child
        .wait_with_output()
        .expect("collect the dry run's output")
}

/// The JSON a successful dry run prints.
fn dry_run(args: &[&str]) -> String {
    succeeded(args, run(args))
}

/// The JSON of a dry run that must have succeeded.
fn succeeded(args: &[&str], output: Output) -> String {
    let stdout = String::from_utf8(output.stdout).expect("UTF-8 stdout");
    assert!(
        output.status.success(),
        "`bigfleet-libvirt offerings {args:?}` failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let parsed: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{stdout}"));
    let slots = parsed["slots"].as_array().expect("a slots array");
    let mut ids: Vec<&str> = slots.iter().map(|s| s["id"].as_str().unwrap()).collect();
    let count = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), count, "duplicate machine ids in {args:?}");
    stdout
}

/// The one-line error of a refused dry run.
fn refused(args: &[&str]) -> String {
    let output = run(args);
    assert!(
        !output.status.success(),
        "`bigfleet-libvirt offerings {args:?}` was accepted"
    );
    assert!(
        output.stdout.is_empty(),
        "a refused dry run prints no inventory"
    );
    let stderr = String::from_utf8(output.stderr).expect("UTF-8 stderr");
    let stderr = stderr.trim_end();
    assert_eq!(stderr.lines().count(), 1, "one line, got:\n{stderr}");
    stderr.to_owned()
}

#[test]
fn built_in_defaults() {
    insta::assert_snapshot!("defaults", dry_run(&[]));
}

#[test]
fn built_in_offerings_at_several_seed_counts() {
    insta::assert_snapshot!("seed_count_1", dry_run(&["--seed-count", "1"]));
    insta::assert_snapshot!("seed_count_7", dry_run(&["--seed-count", "7"]));
    // Values <= 0 mean 16.
    insta::assert_snapshot!("seed_count_0", dry_run(&["--seed-count", "0"]));
}

#[test]
fn built_in_bare_metal_pool() {
    insta::assert_snapshot!(
        "bare_metal_seed_count_6",
        dry_run(&["--capacity-type", "bare_metal", "--seed-count", "6"])
    );
}

#[test]
fn connect_zones_shape_the_built_in_offerings() {
    // With --use-fake-backend the connections are parsed and validated, never dialled.
    insta::assert_snapshot!(
        "connect_two_zones",
        dry_run(&[
            "--use-fake-backend",
            "--connect",
            "rack1=qemu:///system,rack2=qemu+tls://h2/system",
            "--seed-count",
            "8",
        ])
    );
    insta::assert_snapshot!(
        "connect_bare_uri_default_zone",
        dry_run(&[
            "--use-fake-backend",
            "--connect",
            "qemu:///system",
            "--default-zone",
            "dc1",
            "--seed-count",
            "4",
        ])
    );
    insta::assert_snapshot!(
        "connect_three_zones_bare_metal",
        dry_run(&[
            "--use-fake-backend",
            "--connect",
            "a=qemu+tls://h1/system,b=qemu+tls://h2/system,c=qemu+tls://h3/system",
            "--capacity-type",
            "bare_metal",
            "--seed-count",
            "5",
        ])
    );
}

/// The install guide's `connect` value (two hosts over qemu+libssh with a pinned
/// known_hosts) is accepted as written.
#[test]
fn install_guide_connect_value() {
    let connect = "rack1=qemu+libssh://bigfleet@host-a/system?keyfile=/etc/bigfleet/libvirt-ssh/id_ed25519&known_hosts=/etc/bigfleet/libvirt-ssh/known_hosts&known_hosts_verify=normal,rack2=qemu+libssh://bigfleet@host-b/system?keyfile=/etc/bigfleet/libvirt-ssh/id_ed25519&known_hosts=/etc/bigfleet/libvirt-ssh/known_hosts&known_hosts_verify=normal";
    insta::assert_snapshot!(
        "install_guide_connect",
        dry_run(&[
            "--use-fake-backend",
            "--provider",
            "libvirt-dc1",
            "--connect",
            connect,
            "--seed-count",
            "4",
        ])
    );
}

#[test]
fn explicit_prices_and_a_custom_catalog() {
    insta::assert_snapshot!(
        "custom_catalog_with_prices",
        dry_run(&[
            "--instance-types",
            "deploy/examples/instance-types.json",
            "--prices",
            "metal.full=1.25",
            "--seed-count",
            "4",
        ])
    );
}

/// Each example offerings file, with the flags deploy/README.md pairs it with. A new example
/// file must be added here (and so get a snapshot).
const EXAMPLES: &[(&str, &[&str])] = &[
    (
        "offerings.dc1.json",
        &[
            "--provider",
            "libvirt-dc1",
            "--offerings",
            "deploy/examples/offerings.dc1.json",
        ],
    ),
    (
        "offerings.dc2-metal.json",
        &[
            "--provider",
            "libvirt-dc2",
            "--instance-types",
            "deploy/examples/instance-types.json",
            "--offerings",
            "deploy/examples/offerings.dc2-metal.json",
        ],
    ),
];

#[test]
fn example_offerings_files() {
    let dir = repo_root().join("deploy/examples");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("offerings.") && name.ends_with(".json"))
        .collect();
    on_disk.sort();
    let mut covered: Vec<String> = EXAMPLES.iter().map(|(f, _)| (*f).to_owned()).collect();
    covered.sort();
    assert_eq!(
        on_disk, covered,
        "every deploy/examples/offerings.*.json needs a dry-run snapshot"
    );
    for (file, args) in EXAMPLES {
        assert!(Path::new(&dir.join(file)).is_file());
        insta::assert_snapshot!(format!("example_{file}"), dry_run(args));
    }
}

/// The dc1 example offerings name the zones of the dc1 example `connect` value.
#[test]
fn example_offerings_match_their_connect_zones() {
    let output = dry_run(&[
        "--use-fake-backend",
        "--provider",
        "libvirt-dc1",
        "--connect",
        "rack1=qemu:///system,rack2=qemu+tls://h2/system",
        "--offerings",
        "deploy/examples/offerings.dc1.json",
    ]);
    let parsed: serde_json::Value = serde_json::from_str(&output).unwrap();
    for slot in parsed["slots"].as_array().unwrap() {
        let zone = slot["zone"].as_str().unwrap();
        assert!(zone == "rack1" || zone == "rack2", "zone {zone}");
    }
}

#[test]
fn bad_offerings_json_is_refused_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("offerings.json");
    std::fs::write(&path, "[{\"instance_type\": \"kvm.small\",").unwrap();
    let error = refused(&["--offerings", path.to_str().unwrap()]);
    assert!(error.contains("--offerings"), "{error}");

    std::fs::write(&path, "[]").unwrap();
    let error = refused(&["--offerings", path.to_str().unwrap()]);
    assert!(error.contains("--offerings"), "{error}");

    let error = refused(&["--offerings", "deploy/examples/does-not-exist.json"]);
    assert!(error.contains("--offerings"), "{error}");
}

#[test]
fn unknown_or_unmeaningful_capacity_types_are_refused_naming_the_flag() {
    for capacity in ["spot", "reserved", "preemptible"] {
        let error = refused(&["--capacity-type", capacity]);
        assert!(error.contains("--capacity-type"), "{error}");
        assert!(error.contains(capacity), "{error}");
    }
}

#[test]
fn bad_connect_values_are_refused_naming_the_flag() {
    for connect in [
        "rack1=qemu+tcp://h/system",
        "rack1",
        "rack1=qemu:///system,rack1=qemu+tls://h2/system",
        "rack1=qemu+libssh://u@h/system?known_hosts_verify=ignore",
        "rack1=qemu+tls://h/system?no_verify=1",
    ] {
        let error = refused(&["--use-fake-backend", "--connect", connect]);
        assert!(error.contains("--connect"), "{connect}: {error}");
    }
}

#[test]
fn other_bad_inputs_are_refused_naming_the_flag() {
    let error = refused(&["--instance-types", "deploy/examples/offerings.dc1.json"]);
    assert!(error.contains("--instance-types"), "{error}");
    let error = refused(&["--prices", "kvm.nope=1"]);
    assert!(error.contains("--prices"), "{error}");
}

#[test]
fn bad_platform_flags_are_refused_naming_the_flag() {
    let error = refused(&["--use-fake-backend", "--domain-type", "xen"]);
    assert!(error.contains("--domain-type"), "{error}");
    let error = refused(&["--use-fake-backend", "--firmware", "coreboot"]);
    assert!(
        error.contains("--firmware") && error.contains("bios or efi"),
        "{error}"
    );
    let error = refused(&["--use-fake-backend", "--seed-bus", "ide"]);
    assert!(
        error.contains("--seed-bus") && error.contains("virtio or sata"),
        "{error}"
    );
    let error = refused(&["--use-fake-backend", "--guest-initrd", "/guest/initrd.img"]);
    assert!(error.contains("--guest-kernel"), "{error}");
    let error = refused(&["--use-fake-backend", "--guest-cmdline", "console=ttyS0"]);
    assert!(error.contains("--guest-kernel"), "{error}");
    let error = refused(&["--use-fake-backend", "--guest-kernel", "guest/vmlinuz"]);
    assert!(
        error.contains("--guest-kernel") && error.contains("absolute"),
        "{error}"
    );
    let error = refused(&[
        "--use-fake-backend",
        "--guest-kernel",
        "/guest/vmlinuz",
        "--guest-initrd",
        "initrd.img",
    ]);
    assert!(error.contains("--guest-initrd"), "{error}");
    dry_run(&[
        "--use-fake-backend",
        "--domain-type",
        "qemu",
        "--firmware",
        "efi",
        "--seed-bus",
        "sata",
        "--guest-kernel",
        "/guest/vmlinuz",
        "--guest-initrd",
        "/guest/initrd.img",
        "--guest-cmdline",
        "console=ttyS0 panic=-1",
        "--network",
        "",
    ]);
}

#[test]
fn bad_device_flags_are_refused_naming_the_flag_and_the_forms() {
    let fake = "--use-fake-backend";
    let cases: [(&[&str], &[&str]); 7] = [
        (
            &[fake, "--nic", "br0"],
            &["--nic", "network=NAME, bridge=NAME"],
        ),
        (
            &[fake, "--nic", "direct=eth0:loud"],
            &["--nic", "macvtap mode \"loud\""],
        ),
        (
            &[fake, "--nic", "bridge=br0", "--network", "lan"],
            &["--network and --nic", "--nic network=NAME"],
        ),
        (
            &[fake, "--instance-nic", "kvm.huge:bridge=br0"],
            &[
                "--instance-nic",
                "unknown instance type \"kvm.huge\"",
                "kvm.small",
            ],
        ),
        (
            &[fake, "--instance-nic", "bridge=br0"],
            &["INSTANCE_TYPE:VALUE"],
        ),
        (
            &[fake, "--domain-type", "qemu", "--cpu", "host-model"],
            &["--cpu host-model", "need KVM", "qemu64"],
        ),
        (
            &[
                fake,
                "--instance-cpu",
                "kvm.small:qemu64",
                "--instance-cpu",
                "kvm.small:max",
            ],
            &["--instance-cpu names kvm.small twice"],
        ),
    ];
    for (args, says) in cases {
        let error = refused(args);
        for needle in says {
            assert!(
                error.contains(needle),
                "{args:?}: {needle:?} not in {error}"
            );
        }
    }
    dry_run(&[
        fake,
        "--nic",
        "network=default",
        "--nic",
        "direct=eth0:vepa",
        "--instance-nic",
        "kvm.large:bridge=br0",
        "--cpu",
        "host-passthrough,-arch-capabilities",
        "--instance-cpu",
        "kvm.small:qemu64,+pcid",
    ]);
}

/// The long flags a `--help` text lists (its option lines, not their descriptions).
fn help_flags(args: &[&str]) -> BTreeSet<String> {
    let output = Command::new(binary())
        .args(args)
        .arg("--help")
        .env_clear()
        .output()
        .expect("run --help");
    assert!(output.status.success(), "{args:?} --help failed");
    let help = String::from_utf8(output.stdout).expect("UTF-8 help");
    help.lines()
        .filter(|line| line.len() - line.trim_start().len() <= 6)
        .filter_map(|line| line.split_whitespace().find(|word| word.starts_with("--")))
        .map(|word| word.trim_end_matches(',').to_owned())
        .filter(|flag| flag != "--help" && flag != "--version")
        .collect()
}

/// Every serving flag has a row in the README's flag table and every flag a row names
/// exists: the flags are declared once (`infra/app/src/launch/flags.rs`), and the README
/// must not drift from them. The subcommands' own flags have rows of their own (`doctor --output`).
#[test]
fn the_readme_flag_table_names_exactly_the_serving_flags() {
    let serving = help_flags(&[]);
    assert!(
        serving.contains("--addr") && serving.contains("--host-budget"),
        "{serving:?}"
    );
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let documented: BTreeSet<String> = readme
        .lines()
        .filter(|line| line.starts_with("| `--"))
        .filter_map(|line| line.split('|').nth(1))
        .flat_map(|cell| cell.split('`').filter(|word| word.starts_with("--")))
        .map(str::to_owned)
        .collect();
    let undocumented: Vec<_> = serving.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&serving).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "flags in --help without a README row: {undocumented:?}; README rows naming no flag \
         of --help: {unknown:?}"
    );
    let mut own = BTreeSet::new();
    for args in [&["doctor"][..], &["state", "inspect"]] {
        own.extend(help_flags(args).difference(&serving).cloned());
    }
    assert!(
        own.contains("--trial-domain") && own.contains("--machine"),
        "{own:?}"
    );
    let unmentioned: Vec<_> = own.iter().filter(|flag| !mentions(&readme, flag)).collect();
    assert!(
        unmentioned.is_empty(),
        "subcommand flags the README never names: {unmentioned:?}"
    );
}

/// Whether `text` names `flag` as a whole word (`--machine`, not `--machine-id`).
fn mentions(text: &str, flag: &str) -> bool {
    text.match_indices(flag).any(|(at, _)| {
        !text[at + flag.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-')
    })
}

/// A path flag (or `--client-identity`) set to the empty string, as an empty variable in a
/// chart sets it, is unset: the same plan as leaving it out.
#[test]
fn empty_path_and_identity_flags_are_unset() {
    let empty = [
        "--state=",
        "--base-user-data=",
        "--instance-types=",
        "--offerings=",
        "--tls-cert=",
        "--tls-key=",
        "--tls-ca=",
        "--client-identity=",
    ];
    assert_eq!(dry_run(&empty), dry_run(&[]));
}

/// A flag's `BIGFLEET_LIBVIRT_<FLAG>` variable sets it as the flag does.
#[test]
fn a_flag_variable_sets_the_flag() {
    let by_variable = succeeded(
        &[],
        run_with_env(&[], &[("BIGFLEET_LIBVIRT_SEED_COUNT", "8")]),
    );
    assert_eq!(by_variable, dry_run(&["--seed-count", "8"]));
    assert_ne!(by_variable, dry_run(&[]));
}

/// The binary's command line, compiled into the tests so they walk clap's own declaration of
/// every flag (the binary reads its fields; the tests only its `Command`).
#[allow(dead_code)]
#[path = "../../infra/bin/src/cli.rs"]
mod cli;

/// The flags that read a variable of another name, and which: `--otlp-endpoint` reads
/// OpenTelemetry's standard variable, which collectors' guides and the chart set.
const OTHER_VARIABLES: &[(&str, &str)] = &[("otlp-endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT")];

/// The variable `--<long>` must read: `BIGFLEET_LIBVIRT_<FLAG>` (upper case, dashes as
/// underscores), unless [`OTHER_VARIABLES`] names another.
fn variable_of(long: &str) -> String {
    OTHER_VARIABLES
        .iter()
        .find(|(flag, _)| *flag == long)
        .map_or_else(
            || format!("BIGFLEET_LIBVIRT_{}", long.to_uppercase().replace('-', "_")),
            |(_, variable)| (*variable).to_owned(),
        )
}

/// Every flag of `command` and of its subcommands, at any depth, that reads no variable or
/// another than [`variable_of`] says, as `<subcommands> --<flag>: ...`.
fn flags_without_their_variable(command: &clap::Command, path: &str) -> Vec<String> {
    let mut wrong = Vec::new();
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else {
            continue;
        };
        if matches!(long, "help" | "version") {
            continue;
        }
        let expected = variable_of(long);
        let actual = arg.get_env().map(|v| v.to_string_lossy().into_owned());
        if actual.as_deref() != Some(expected.as_str()) {
            wrong.push(format!(
                "{path}--{long}: reads {actual:?}, must read {expected}"
            ));
        }
    }
    for sub in command.get_subcommands() {
        let path = format!("{path}{} ", sub.get_name());
        wrong.extend(flags_without_their_variable(sub, &path));
    }
    wrong
}

/// Every flag of every subcommand reads its `BIGFLEET_LIBVIRT_<FLAG>` variable (the README
/// promises it): walked from clap's declaration, so a new flag without one fails here.
#[test]
fn every_flag_of_every_subcommand_reads_its_variable() {
    let command = <cli::Cli as clap::CommandFactory>::command();
    let subcommands: Vec<&str> = command.get_subcommands().map(|s| s.get_name()).collect();
    assert!(
        subcommands.contains(&"doctor") && subcommands.contains(&"state"),
        "{subcommands:?}"
    );
    let wrong = flags_without_their_variable(&command, "");
    assert!(
        wrong.is_empty(),
        "flags without their variable (add env = \"BIGFLEET_LIBVIRT_<FLAG>\" to the flag's \
         #[arg]):\n{}",
        wrong.join("\n")
    );
    // The walk catches a flag without a variable, one with the wrong one, and both in a
    // nested subcommand; a flag with its own passes.
    let planted = clap::Command::new("p")
        .arg(
            clap::Arg::new("a")
                .long("good-flag")
                .env("BIGFLEET_LIBVIRT_GOOD_FLAG"),
        )
        .arg(clap::Arg::new("b").long("bare"))
        .subcommand(
            clap::Command::new("s").subcommand(
                clap::Command::new("t")
                    .arg(
                        clap::Arg::new("c")
                            .long("typo")
                            .env("BIGFLEET_LIBVIRT_TYPO_"),
                    )
                    .arg(clap::Arg::new("d").long("also-bare")),
            ),
        );
    assert_eq!(
        flags_without_their_variable(&planted, ""),
        [
            "--bare: reads None, must read BIGFLEET_LIBVIRT_BARE",
            "s t --typo: reads Some(\"BIGFLEET_LIBVIRT_TYPO_\"), must read BIGFLEET_LIBVIRT_TYPO",
            "s t --also-bare: reads None, must read BIGFLEET_LIBVIRT_ALSO_BARE",
        ]
    );
}

/// A repeatable flag's variable takes several values, separated by `;` (a CPU choice has
/// commas of its own): each is read, as each repeated flag is. The second value names an
/// unknown instance type or a bad NIC, so the refusal proves it was read.
#[test]
fn a_repeatable_flag_variable_takes_several_values() {
    let refused_by = |name: &str, value: &str| {
        let output = run_with_env(&[], &[(name, value)]);
        assert!(!output.status.success(), "{name}={value} was accepted");
        String::from_utf8(output.stderr).expect("UTF-8 stderr")
    };
    let cpu = refused_by(
        "BIGFLEET_LIBVIRT_INSTANCE_CPU",
        "kvm.small:qemu64,+avx;kvm.huge:qemu64",
    );
    assert!(
        cpu.contains("--instance-cpu") && cpu.contains("\"kvm.huge\""),
        "{cpu}"
    );
    let nic = refused_by("BIGFLEET_LIBVIRT_NIC", "network=default;bridge");
    assert!(nic.contains("--nic") && nic.contains("\"bridge\""), "{nic}");
    let per_type = refused_by(
        "BIGFLEET_LIBVIRT_INSTANCE_NIC",
        "kvm.small:bridge=br0;kvm.huge:bridge=br1",
    );
    assert!(
        per_type.contains("--instance-nic") && per_type.contains("\"kvm.huge\""),
        "{per_type}"
    );
    let good = [
        ("BIGFLEET_LIBVIRT_NIC", "network=default;bridge=br0"),
        ("BIGFLEET_LIBVIRT_INSTANCE_NIC", "kvm.small:bridge=br0"),
        (
            "BIGFLEET_LIBVIRT_INSTANCE_CPU",
            "kvm.small:qemu64,+avx;kvm.large:host-model",
        ),
    ];
    assert_eq!(succeeded(&[], run_with_env(&[], &good)), dry_run(&[]));
}

/// A subcommand's own flags read their variables too: `BIGFLEET_LIBVIRT_OUTPUT=json` makes
/// `doctor` print its (refused, there being no host) report as JSON.
#[test]
fn a_subcommand_flag_variable_sets_the_flag() {
    let doctor = |output: Option<&str>| {
        let mut command = Command::new(binary());
        command.arg("doctor").current_dir(repo_root()).env_clear();
        if let Some(output) = output {
            command.env("BIGFLEET_LIBVIRT_OUTPUT", output);
        }
        let done = command.output().expect("run doctor");
        assert_eq!(done.status.code(), Some(1), "a fake backend blocks doctor");
        String::from_utf8(done.stdout).expect("UTF-8 report")
    };
    let json: serde_json::Value =
        serde_json::from_str(&doctor(Some("json"))).expect("BIGFLEET_LIBVIRT_OUTPUT=json");
    assert_eq!(json["checks"][0]["check"], "configuration", "{json}");
    let table = doctor(None);
    assert!(
        serde_json::from_str::<serde_json::Value>(&table).is_err() && table.contains("verdict"),
        "{table}"
    );
}

mod addresses;
mod firmware;
mod ignition;
mod placement;
