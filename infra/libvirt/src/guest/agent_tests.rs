//! The guest-agent protocol against an in-memory agent: request building and reply
//! parsing, readiness, chunked file transfer, exec polling, exit/signal judgement and
//! output bounding, and the bootstrap and drain sequences built on them.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde_json::{Value, json};

use super::*;
use crate::guest::bootstrap as guest;
use bigfleet_libvirt_domain::Timeouts;
use bigfleet_libvirt_system::SystemClock;

/// How a fake process ends.
#[derive(Clone, Debug, Default)]
struct Ending {
    exitcode: Option<i64>,
    signal: Option<i64>,
    out: Vec<u8>,
    err: Vec<u8>,
}

fn exit(code: i64) -> Ending {
    Ending {
        exitcode: Some(code),
        ..Ending::default()
    }
}

#[derive(Default)]
struct State {
    log: Vec<Value>,
    files: BTreeMap<String, Vec<u8>>,
    handles: BTreeMap<i64, String>,
    processes: BTreeMap<i64, (u32, Ending)>,
    failing_pings: u32,
}

type Behaviour = Box<dyn Fn(&str, &[String]) -> Ending + Send + Sync>;

/// An in-memory qemu agent.
struct FakeAgent {
    state: Mutex<State>,
    behaviour: Behaviour,
    unsupported: bool,
    max_write: usize,
    /// Commands turned off (as by qemu-ga's `--block-rpcs`).
    disabled: Vec<&'static str>,
    /// Answers `guest-info` as an unknown command.
    no_info: bool,
}

/// The commands the fake knows, as `guest-info` lists them.
const KNOWN: [&str; 7] = [
    "guest-ping",
    "guest-info",
    "guest-file-open",
    "guest-file-write",
    "guest-file-close",
    "guest-exec",
    "guest-exec-status",
];

impl FakeAgent {
    fn new(behaviour: impl Fn(&str, &[String]) -> Ending + Send + Sync + 'static) -> Self {
        Self {
            state: Mutex::new(State::default()),
            behaviour: Box::new(behaviour),
            unsupported: false,
            max_write: usize::MAX,
            disabled: Vec::new(),
            no_info: false,
        }
    }

    fn with_disabled(mut self, disabled: &[&'static str]) -> Self {
        self.disabled = disabled.to_vec();
        self
    }

    fn commands(&self) -> Vec<String> {
        let state = self.state.lock().unwrap();
        state
            .log
            .iter()
            .map(|v| v["execute"].as_str().unwrap().to_owned())
            .collect()
    }

    /// The `guest-info` answer: every known command, enabled unless turned off.
    fn info(&self) -> Value {
        let commands: Vec<Value> = KNOWN
            .iter()
            .map(|name| {
                let enabled = !self.disabled.contains(name);
                json!({ "name": name, "enabled": enabled, "success-response": true })
            })
            .collect();
        json!({ "version": "7.2.0", "supported_commands": commands })
    }

    fn answer(&self, request: &Value) -> Result<Value, AgentError> {
        let mut state = self.state.lock().unwrap();
        state.log.push(request.clone());
        let args = &request["arguments"];
        let next_id = |map_len: usize| i64::try_from(map_len).unwrap() + 1000;
        let execute = request["execute"].as_str().unwrap();
        if self.disabled.contains(&execute) {
            let desc = format!("Command {execute} has been disabled");
            return Ok(json!({ "error": { "class": "GenericError", "desc": desc } }));
        }
        Ok(match execute {
            "guest-info" if !self.no_info => self.info(),
            "guest-ping" if state.failing_pings > 0 => {
                state.failing_pings -= 1;
                return Err(AgentError::NotReady("agent not connected".into()));
            }
            "guest-ping" => json!({}),
            "guest-file-open" => {
                let path = args["path"].as_str().unwrap().to_owned();
                state.files.insert(path.clone(), Vec::new());
                let handle = next_id(state.handles.len());
                state.handles.insert(handle, path);
                json!(handle)
            }
            "guest-file-write" => {
                let path = state.handles[&args["handle"].as_i64().unwrap()].clone();
                let data = BASE64.decode(args["buf-b64"].as_str().unwrap()).unwrap();
                let count = data.len().min(self.max_write);
                state.files.get_mut(&path).unwrap().extend(&data[..count]);
                json!({ "count": count, "eof": false })
            }
            "guest-file-close" => {
                state.handles.remove(&args["handle"].as_i64().unwrap());
                json!({})
            }
            "guest-exec" => {
                let argv: Vec<String> = args["arg"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap().to_owned())
                    .collect();
                let ending = (self.behaviour)(args["path"].as_str().unwrap(), &argv);
                let pid = next_id(state.processes.len());
                state.processes.insert(pid, (2, ending));
                json!({ "pid": pid })
            }
            "guest-exec-status" => {
                let pid = args["pid"].as_i64().unwrap();
                let (polls, ending) = state.processes.get_mut(&pid).unwrap();
                if *polls > 0 {
                    *polls -= 1;
                    json!({ "exited": false })
                } else {
                    let mut status = json!({ "exited": true });
                    if let Some(code) = ending.exitcode {
                        status["exitcode"] = json!(code);
                    }
                    if let Some(signal) = ending.signal {
                        status["signal"] = json!(signal);
                    }
                    status["out-data"] = json!(BASE64.encode(&ending.out));
                    status["err-data"] = json!(BASE64.encode(&ending.err));
                    status
                }
            }
            other => json!({ "error": { "class": "CommandNotFound", "desc": other } }),
        })
    }
}

impl GuestAgent for FakeAgent {
    async fn command(&self, json: String, _timeout: i32) -> Result<String, AgentError> {
        if self.unsupported {
            return Err(AgentError::Unsupported(
                "not supported by the driver".into(),
            ));
        }
        let request: Value = serde_json::from_str(&json).expect("requests are JSON");
        let value = self.answer(&request)?;
        if value.get("error").is_some() {
            return Ok(value.to_string());
        }
        Ok(json!({ "return": value }).to_string())
    }
}

/// Whether an exec runs the bootstrap hook (not the preparation step).
fn is_hook(args: &[String]) -> bool {
    args.get(2).is_some_and(|a| a == "bigfleet-bootstrap")
}

fn policy() -> AgentPolicy {
    AgentPolicy {
        chunk_bytes: 1000,
        output_limit: 64,
        ..AgentPolicy::default()
    }
}

#[test]
fn requests_are_json_and_replies_are_checked() {
    let built = request(
        "guest-exec",
        Some(json!({ "path": "/bin/sh", "arg": ["-c", "a\"b"] })),
    );
    let parsed: Value = serde_json::from_str(&built).unwrap();
    assert_eq!(parsed["arguments"]["arg"][1], "a\"b");
    assert_eq!(request("guest-ping", None), r#"{"execute":"guest-ping"}"#);
    assert_eq!(returned(r#"{"return":{"pid":7}}"#).unwrap()["pid"], 7);
    let error = returned(r#"{"error":{"class":"GenericError","desc":"no such file"}}"#);
    assert_eq!(error.unwrap_err(), "agent error GenericError: no such file");
    assert!(returned("{}").is_err());
    assert!(returned("not json").is_err());
}

#[test]
fn exec_status_parsing_decodes_output() {
    let status = parse_status(&json!({
        "exited": true, "exitcode": 3, "out-data": "aGk=", "err-data": "b29wcw=="
    }))
    .unwrap();
    assert_eq!((status.exit_code, status.signal), (Some(3), None));
    assert_eq!(
        (status.stdout.as_slice(), status.stderr.as_slice()),
        (&b"hi"[..], &b"oops"[..])
    );
    assert!(parse_status(&json!({ "exitcode": 0 })).is_err());
    assert!(parse_status(&json!({ "exited": true, "out-data": "%%%" })).is_err());
}

#[test]
fn only_a_clean_zero_exit_succeeds() {
    let status = |exit_code, signal| ExecStatus {
        exited: true,
        exit_code,
        signal,
        stdout: b"out".to_vec(),
        stderr: b"err".to_vec(),
    };
    assert!(judge("hook", &status(Some(0), None), 10).is_ok());
    let failed = judge("hook", &status(Some(2), None), 10).unwrap_err();
    assert_eq!(failed, "hook exited 2 (stderr: err) (stdout: out)");
    let killed = judge("hook", &status(None, Some(9)), 10).unwrap_err();
    assert!(
        killed.starts_with("hook was killed by signal 9"),
        "{killed}"
    );
    // The reference treated a missing exit code as 0; here it is a failure.
    assert!(judge("hook", &status(None, None), 10).is_err());
    assert!(judge("hook", &status(Some(0), Some(15)), 10).is_err());
}

#[test]
fn output_is_bounded_to_its_tail_on_a_char_boundary() {
    assert_eq!(bound(b"  short\n", 10), "short");
    let long = format!("{}END", "x".repeat(5000));
    let shown = bound(long.as_bytes(), 8);
    assert_eq!(shown, "…xxxxxEND");
    let accents = "é".repeat(10);
    let shown = bound(accents.as_bytes(), 5);
    assert!(
        shown.starts_with('…') && shown.len() <= 5 + '…'.len_utf8(),
        "{shown}"
    );
    assert_eq!(bound(&[0xff, b'a'], 10), "\u{fffd}a");
}

/// A minute from now on `SystemClock`.
fn a_minute() -> Timestamp {
    SystemClock.now().saturating_add(Duration::from_secs(60))
}

/// The provider's clock on tokio's (paused) clock, zero when made: `SystemClock` reads the
/// real monotonic clock, which a paused test does not move.
#[derive(Clone)]
struct PausedClock(tokio::time::Instant);

impl Clock for PausedClock {
    fn now(&self) -> Timestamp {
        Timestamp(u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    // A test clock: the one place this test may wait on tokio's timer.
    #[allow(clippy::disallowed_methods)]
    fn sleep_until(&self, deadline: Timestamp) -> impl Future<Output = ()> + Send + 'static {
        tokio::time::sleep_until(self.0 + Duration::from_nanos(deadline.0))
    }
}

#[tokio::test(start_paused = true)]
async fn readiness_retries_until_the_agent_answers() {
    let agent = FakeAgent::new(|_, _| exit(0));
    agent.state.lock().unwrap().failing_pings = 3;
    wait_ready(&agent, &SystemClock, &policy(), a_minute())
        .await
        .unwrap();
    assert_eq!(agent.commands(), ["guest-ping"; 4]);
}

/// An agent that never answers ends the wait at `until` with the reason, in time for the
/// caller to report it before its deadline (here a minute: ~60 pings a second apart).
#[tokio::test(start_paused = true)]
async fn readiness_gives_up_at_its_time_with_the_reason() {
    let agent = FakeAgent::new(|_, _| exit(0));
    agent.state.lock().unwrap().failing_pings = u32::MAX;
    let started = tokio::time::Instant::now();
    let clock = PausedClock(started);
    let until = Timestamp(0).saturating_add(Duration::from_secs(60));
    let error = wait_ready(&agent, &clock, &policy(), until)
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(60) && waited < Duration::from_secs(62),
        "{waited:?}"
    );
    assert!(
        error.starts_with("the qemu guest agent did not answer for 60s (the last ping: "),
        "{error}"
    );
    assert!(error.contains("runs no qemu-guest-agent"), "{error}");
    let pings = agent.commands().len();
    assert!(
        (40..=120).contains(&pings),
        "about one ping a second: {pings}"
    );
}

#[test]
fn the_agent_waits_end_before_the_deadlines() {
    let fitted = AgentPolicy::default().fit_to(&Timeouts::uniform(Duration::from_secs(20)));
    assert_eq!(fitted.configure_wait, Duration::from_secs(18));
    assert_eq!(fitted.drain_wait, Duration::from_secs(18));
    let defaults = AgentPolicy::default();
    assert_eq!(defaults.configure_wait, Duration::from_secs(8 * 60 - 48));
    assert_eq!(defaults.drain_wait, Duration::from_secs(14 * 60));
    let tiny = AgentPolicy::default().fit_to(&Timeouts::uniform(Duration::from_secs(2)));
    assert_eq!(tiny.configure_wait, Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn readiness_gives_up_when_agents_are_unsupported() {
    let mut agent = FakeAgent::new(|_, _| exit(0));
    agent.unsupported = true;
    let error = wait_ready(&agent, &SystemClock, &policy(), a_minute())
        .await
        .unwrap_err();
    assert!(error.contains("cannot be reached"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn files_are_written_in_chunks_and_closed() {
    let mut agent = FakeAgent::new(|_, _| exit(0));
    agent.max_write = 700;
    let blob: Vec<u8> = (0..2500u32)
        .map(|i| u8::try_from(i % 251).unwrap())
        .collect();
    write_file(&agent, &policy(), "/opt/bigfleet/x", &blob)
        .await
        .unwrap();
    let state = agent.state.lock().unwrap();
    assert_eq!(state.files["/opt/bigfleet/x"], blob);
    assert!(state.handles.is_empty(), "the handle is closed");
    let writes: Vec<&Value> = state
        .log
        .iter()
        .filter(|v| v["execute"] == "guest-file-write")
        .collect();
    // At most 1000 bytes per request; the agent takes 700 at a time, the rest is resent.
    assert_eq!(writes.len(), 4);
    for write in writes {
        assert!(write["arguments"]["count"].as_u64().unwrap() <= 1000);
    }
}

#[tokio::test(start_paused = true)]
async fn an_empty_blob_still_creates_the_file() {
    let agent = FakeAgent::new(|_, _| exit(0));
    write_file(&agent, &policy(), "/f", b"").await.unwrap();
    assert_eq!(agent.commands(), ["guest-file-open", "guest-file-close"]);
    assert!(agent.state.lock().unwrap().files["/f"].is_empty());
}

#[tokio::test(start_paused = true)]
async fn bootstrap_delivers_the_blob_by_file_and_runs_the_hook() {
    let agent = FakeAgent::new(|_, _| exit(0));
    let blob = vec![b'S'; 150_000];
    guest::bootstrap(
        &agent,
        &SystemClock,
        &AgentPolicy::default(),
        "cluster-'1",
        &blob,
    )
    .await
    .unwrap();
    let state = agent.state.lock().unwrap();
    assert_eq!(state.files[guest::BLOB], blob);
    let execs: Vec<&Value> = state
        .log
        .iter()
        .filter(|v| v["execute"] == "guest-exec")
        .collect();
    assert_eq!(execs.len(), 2, "prepare, then the hook");
    let hook_args = &execs[1]["arguments"]["arg"];
    assert_eq!(
        hook_args[3], "cluster-'1",
        "the cluster id is a positional argument"
    );
    assert!(hook_args[1].as_str().unwrap().contains(guest::HOOK));
    let encoded = BASE64.encode(&blob[..10]);
    for exec in execs {
        assert!(
            !exec.to_string().contains(&encoded),
            "the blob never rides on argv"
        );
    }
    assert!(state.log[0]["execute"] == "guest-ping");
}

#[tokio::test(start_paused = true)]
async fn a_failing_hook_fails_configure_with_bounded_output() {
    let agent = FakeAgent::new(|_, args| {
        if is_hook(args) {
            Ending {
                exitcode: Some(1),
                err: format!("{}kubeadm join failed", "noise ".repeat(1000)).into_bytes(),
                ..Ending::default()
            }
        } else {
            exit(0)
        }
    });
    let error = guest::bootstrap(&agent, &SystemClock, &policy(), "c1", b"blob")
        .await
        .unwrap_err();
    assert!(
        error.contains("/opt/bigfleet/bootstrap exited 1"),
        "{error}"
    );
    assert!(error.contains("kubeadm join failed"), "{error}");
    assert!(error.len() < 300, "bounded: {} bytes", error.len());
}

#[tokio::test(start_paused = true)]
async fn a_signalled_hook_is_a_failure() {
    let agent = FakeAgent::new(|_, args| {
        if is_hook(args) {
            Ending {
                signal: Some(9),
                ..Ending::default()
            }
        } else {
            exit(0)
        }
    });
    let error = guest::bootstrap(&agent, &SystemClock, &policy(), "c1", b"blob")
        .await
        .unwrap_err();
    assert!(error.contains("killed by signal 9"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn drain_passes_a_grace_of_at_least_one_second() {
    let agent = FakeAgent::new(|_, _| exit(0));
    guest::drain(&agent, &SystemClock, &policy(), 0)
        .await
        .unwrap();
    guest::drain(&agent, &SystemClock, &policy(), 30)
        .await
        .unwrap();
    let state = agent.state.lock().unwrap();
    let graces: Vec<String> = state
        .log
        .iter()
        .filter(|v| v["execute"] == "guest-exec")
        .map(|v| v["arguments"]["arg"][3].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(graces, ["1", "30"]);
}

#[tokio::test(start_paused = true)]
async fn an_agent_with_exec_turned_off_fails_configure_before_running_anything() {
    let agent = FakeAgent::new(|_, _| exit(0)).with_disabled(&["guest-exec"]);
    let e = guest::bootstrap(&agent, &SystemClock, &policy(), "c", b"blob")
        .await
        .unwrap_err();
    assert!(e.contains("does not allow guest-exec (turned off"), "{e}");
    assert!(e.contains("agent 7.2.0"), "{e}");
    assert!(
        e.contains("must allow guest-exec, guest-exec-status, guest-file-open"),
        "{e}"
    );
    assert_eq!(
        agent.commands(),
        ["guest-ping", "guest-info"],
        "nothing ran"
    );
}

#[tokio::test(start_paused = true)]
async fn an_agent_with_file_writes_turned_off_fails_configure_before_preparing_the_guest() {
    let agent =
        FakeAgent::new(|_, _| exit(0)).with_disabled(&["guest-file-write", "guest-file-close"]);
    let e = guest::bootstrap(&agent, &SystemClock, &policy(), "c", b"blob")
        .await
        .unwrap_err();
    assert!(
        e.starts_with("Configure's bootstrap cannot run in this guest"),
        "{e}"
    );
    assert!(
        e.contains("does not allow guest-file-write, guest-file-close"),
        "{e}"
    );
    assert_eq!(
        agent.commands(),
        ["guest-ping", "guest-info"],
        "nothing ran"
    );
    assert!(agent.state.lock().unwrap().files.is_empty());
}

#[tokio::test(start_paused = true)]
async fn drain_needs_exec_only() {
    let agent = FakeAgent::new(|_, _| exit(0)).with_disabled(&["guest-file-write"]);
    guest::drain(&agent, &SystemClock, &policy(), 30)
        .await
        .unwrap();
    let agent = FakeAgent::new(|_, _| exit(0)).with_disabled(&["guest-exec-status"]);
    let e = guest::drain(&agent, &SystemClock, &policy(), 30)
        .await
        .unwrap_err();
    assert!(e.starts_with("Drain cannot run in this guest"), "{e}");
    assert!(e.contains("does not allow guest-exec-status"), "{e}");
}

#[tokio::test(start_paused = true)]
async fn an_agent_that_cannot_list_its_commands_is_not_judged() {
    let mut agent = FakeAgent::new(|_, _| exit(0));
    agent.no_info = true;
    guest::bootstrap(&agent, &SystemClock, &policy(), "c", b"blob")
        .await
        .unwrap();
    let commands = agent.commands();
    assert_eq!(&commands[..2], ["guest-ping", "guest-info"]);
    assert!(commands.contains(&"guest-exec".to_owned()), "{commands:?}");
}

/// A first-boot machine's Drain asks whether the hook can run at all (Talos's agent never
/// allows `guest-exec`): no when the agent lists either drain command disabled, yes when it
/// allows both or cannot list its commands; the question runs nothing in the guest.
#[tokio::test(start_paused = true)]
async fn the_drain_question_is_no_only_when_the_agent_lists_a_drain_command_off() {
    use crate::guest::probe;
    let allows = |agent: FakeAgent| async move {
        let answer = probe::allows(&agent, &policy(), &probe::DRAIN).await;
        assert_eq!(agent.commands(), ["guest-info"], "nothing ran");
        answer
    };
    assert!(allows(FakeAgent::new(|_, _| exit(0))).await);
    let talos = FakeAgent::new(|_, _| exit(0)).with_disabled(&["guest-exec"]);
    assert!(!allows(talos).await);
    let no_status = FakeAgent::new(|_, _| exit(0)).with_disabled(&["guest-exec-status"]);
    assert!(!allows(no_status).await);
    let files_off = FakeAgent::new(|_, _| exit(0)).with_disabled(&["guest-file-write"]);
    assert!(allows(files_off).await, "Drain writes no file");
    let mut silent = FakeAgent::new(|_, _| exit(0));
    silent.no_info = true;
    assert!(allows(silent).await);
}
