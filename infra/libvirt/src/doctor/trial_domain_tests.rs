//! The trial domains on libvirt's test driver: a choice it starts passes and leaves no
//! domain behind; one it refuses (a CPU feature named twice) fails with libvirt's words.

use std::collections::BTreeMap;
use std::time::Duration;

use virt::connect::Connect;

use super::*;
use crate::render::xml::Firmware;

fn cpu(text: &str) -> CpuChoice {
    CpuChoice::parse(text).unwrap()
}

fn plan(choices: Vec<TrialCpu>) -> TrialPlan {
    TrialPlan {
        choices,
        platform: Platform::default(),
        settle: Duration::from_millis(10),
    }
}

#[test]
fn choices_are_distinct_and_name_their_instance_types() {
    let options = DomainConfig {
        cpu: Some(cpu("host-model")),
        instance_cpu: BTreeMap::from([
            ("big".to_owned(), cpu("qemu64")),
            ("odd".to_owned(), cpu("host-model")),
        ]),
        ..DomainConfig::default()
    };
    let found = choices(&options, ["small", "big", "odd", "small", "tiny"]);
    assert_eq!(
        found,
        vec![
            TrialCpu {
                cpu: Some(cpu("host-model")),
                used_by: vec!["small".to_owned(), "odd".to_owned(), "tiny".to_owned()],
            },
            TrialCpu {
                cpu: Some(cpu("qemu64")),
                used_by: vec!["big".to_owned()],
            },
        ]
    );
    let defaults = choices(&DomainConfig::default(), ["small"]);
    assert_eq!(defaults[0].cpu, None);
    assert_eq!(
        shown(None, DomainType::Kvm),
        "host-passthrough (the default)"
    );
}

#[test]
fn the_trial_xml_has_production_cpu_and_firmware_and_no_devices() {
    let platform = Platform {
        firmware: Firmware::Efi,
        ..Platform::default()
    };
    let xml = trial_xml("bigfleet-doctor-trial-x", None, &platform);
    assert!(
        xml.contains("<cpu mode='host-passthrough' check='none'/>"),
        "{xml}"
    );
    assert!(xml.contains("<os firmware='efi'>"), "{xml}");
    assert!(xml.contains("machine='q35'"), "{xml}");
    assert!(
        !xml.contains("<disk") && !xml.contains("<interface"),
        "{xml}"
    );
    assert!(!xml.contains("<metadata"), "no ownership tag: {xml}");
    let doc = roxmltree::Document::parse(&xml).expect("well-formed");
    assert_eq!(doc.root_element().attribute("type"), Some("kvm"));
}

#[test]
fn a_started_choice_passes_and_a_refused_one_fails_with_libvirts_words() {
    virt::error::clear_error_callback();
    // A node file of its own: `test:///default` is shared with the other tests.
    let dir = tempfile::tempdir().unwrap();
    let uri = crate::host::fixture::Fixture::default()
        .write(dir.path(), "trial.xml")
        .unwrap();
    let conn = Connect::open(Some(&uri)).unwrap();
    let before = conn.list_all_domains(0).unwrap().len();
    let trials = run(
        &conn,
        "trial-test",
        &plan(vec![
            TrialCpu {
                cpu: None,
                used_by: vec!["small".to_owned()],
            },
            TrialCpu {
                cpu: Some(cpu("Skylake-Server,+pcid,-pcid")),
                used_by: vec!["big".to_owned()],
            },
        ]),
    );
    assert_eq!(trials.len(), 2, "{trials:#?}");
    let started = &trials[0];
    assert!(started.host_cpu);
    let seen = started.outcome.as_ref().expect("the test driver starts it");
    assert!(seen.contains("stayed up"), "{seen}");
    let refused = &trials[1];
    assert!(!refused.host_cpu);
    let why = refused.outcome.as_ref().expect_err("a feature named twice");
    assert!(why.contains("would not start the trial domain"), "{why}");
    assert!(why.contains("specified more than once"), "{why}");
    assert_eq!(
        conn.list_all_domains(0).unwrap().len(),
        before,
        "every trial domain is destroyed"
    );
    let names: Vec<String> = (conn.list_all_domains(0).unwrap().iter())
        .filter_map(|d| d.name().ok())
        .collect();
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("bigfleet-doctor-trial-")),
        "{names:?}"
    );
}

#[test]
fn trial_names_are_stable_per_label_and_never_the_providers() {
    assert_eq!(trial_name("libvirt", 0), trial_name("libvirt", 0));
    assert_ne!(trial_name("libvirt", 0), trial_name("libvirt-dc2", 0));
    assert_ne!(trial_name("libvirt", 0), trial_name("libvirt", 1));
    let name = trial_name("libvirt", 3);
    assert!(name.starts_with("bigfleet-doctor-trial-"), "{name}");
    assert!(name.ends_with("-3"), "{name}");
    // The provider's names are `bigfleet-` and hex digits only; a trial's never is.
    let provider = bigfleet_libvirt_config::naming::domain_name("libvirt", "doctor");
    let hex_only = |n: &str| {
        n["bigfleet-".len()..]
            .chars()
            .all(|c| c.is_ascii_hexdigit())
    };
    assert!(hex_only(&provider), "{provider}");
    assert!(!hex_only(&name), "{name}");
}
