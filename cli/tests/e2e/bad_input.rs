//! Hostile and impossible input: garbage on the ports, another node's or
//! cluster's data directory, bad configuration, records and requests no
//! node can accept. Each gets a clear error at once; the cluster keeps
//! serving.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::*;

#[test]
fn bad_input_gets_clear_errors_and_the_cluster_keeps_serving() {
    let c = Cluster::start(3, &[]);
    let history = History::default();
    assert_ok(
        &history
            .append_lines(&c.endpoints(), &["before".to_string()])
            .0,
    );
    garbage_on_every_port(&c);
    requests_no_node_accepts(&c, &history);
    // Every garbage connection to a node's fabric port was refused (and
    // counted: waiting for the count, not for a time).
    let garbage: BTreeMap<u64, u64> = c.ids().into_iter().map(|id| (id, 2)).collect();
    c.wait_counters_above("rejected_handshakes", &garbage, Duration::from_secs(60));
    outsiders_cannot_join(&c);
    // Every node still serves, the log is intact, nobody was disturbed.
    assert_ok(
        &history
            .append_lines(&c.endpoints(), &["after".to_string()])
            .0,
    );
    let data: Vec<String> = history
        .read_all(&c, &c.endpoints())
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    assert_eq!(data, vec!["before", "after"]);
    for id in c.ids() {
        assert!(c.status(id).is_some(), "node {id} still answers");
    }
    history.assert_valid(&c.final_logs(&c.ids()));
    let members = c.cli(&["members", "list"]);
    assert_eq!(lines(&members).len(), 3, "nobody joined");
}

/// Garbage, a huge zero message and an HTTP path attack on every port of
/// every node.
fn garbage_on_every_port(c: &Cluster) {
    for id in c.ids() {
        for addr in [c.client(id), c.listen(id), c.metrics(id)] {
            raw_garbage(&addr, b"\x16\x03\x01\x02\x00garbage\xff\xff\xff\xff");
            raw_garbage(&addr, &[0u8; 70_000]);
            raw_garbage(&addr, b"GET /../../etc/passwd HTTP/1.1\r\n\r\n");
        }
    }
}

/// A record above `--max-record`, a bad range and bad client arguments:
/// each refused with a clear error.
fn requests_no_node_accepts(c: &Cluster, history: &History) {
    let big = "x".repeat(70_000);
    let (out, _) = history.append_lines(&c.endpoints(), &[big]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("max-record"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = c.cli(&["read", "--from", "10", "--to", "2"]);
    assert!(!out.status.success());
    // Bad client arguments are refused before anything is sent.
    let out = c.cli(&["read", "--format", "xml"]);
    assert!(!out.status.success());
}

/// A node that does not hold the secret cannot join, nor one with the
/// right secret but another cluster id. Each runs until every node of the
/// cluster refused it once.
fn outsiders_cannot_join(c: &Cluster) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("secret"),
        "another cluster's secret, 16+ bytes",
    )
    .unwrap();
    let secret_file = dir.path().join("secret").to_str().unwrap().to_string();
    for (id, extra) in [
        ("9", ["--secret-file", secret_file.as_str()]),
        ("8", ["--cluster-id", "12345"]),
    ] {
        let listen = format!("127.0.0.1:{}", free_port());
        let refused_before: BTreeMap<u64, u64> = c
            .ids()
            .into_iter()
            .map(|n| (n, c.nic_counter(n, "rejected_handshakes").unwrap()))
            .collect();
        let mut outsider = Command::new(BIN)
            .args([
                "serve",
                "--id",
                id,
                "--data-dir",
                dir.path().join(id).to_str().unwrap(),
                "--ring-dir",
                dir.path().join("shm").to_str().unwrap(),
                "--listen",
                &listen,
                "--client",
                &format!("127.0.0.1:{}", free_port()),
                "--peers",
                &format!("{id}={listen},{}", c.peers()),
                "--fabric",
                "tcp",
                "--bootstrap",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        c.wait_counters_above(
            "rejected_handshakes",
            &refused_before,
            Duration::from_secs(120),
        );
        let _ = outsider.kill();
        let _ = outsider.wait();
    }
}

#[test]
fn a_data_dir_of_another_node_or_cluster_is_refused() {
    let c = Cluster::start(3, &[]);
    assert!(c.cli(&["append", "x"]).status.success());
    c.stop(2);
    // Node 3's data dir for node 2.
    let dir3 = c.dir(3);
    let mut args = c.serve_args(2);
    let k = args.iter().position(|a| a == "--data-dir").unwrap();
    args[k + 1] = dir3.to_str().unwrap().to_string();
    let out = Command::new(BIN).args(&args).output().unwrap();
    assert!(!out.status.success(), "node 2 started on node 3's data");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("node id"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Node 2's own dir under another cluster id.
    let mut args = c.serve_args(2);
    args.extend(["--cluster-id".to_string(), "99".to_string()]);
    let out = Command::new(BIN).args(&args).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cluster id"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The right directory still works.
    c.boot(2);
    c.wait_leader(Duration::from_secs(30));
    assert_eq!(c.read_all(&c.client(2)).len(), 1);
}

#[test]
fn bad_configuration_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("n.toml");
    std::fs::write(&conf, "id = 1\nbogus_key = true\n").unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--config", conf.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown field"));
    let err = refused_serve(&["--ring-capacity", "1000"]);
    assert!(err.contains("ring-capacity"), "{err}");
    // Retention flags.
    for (flag, value, says) in [
        ("--retain-bytes", "lots", "not a byte count"),
        ("--retain-bytes", "1KiB", "at least"),
        ("--retain-age", "0s", "above zero"),
        ("--retain-age", "soon", "not a duration"),
    ] {
        let err = refused_serve(&[flag, value]);
        assert!(
            err.contains(flag) && err.contains(says),
            "{flag} {value}: {err}"
        );
    }
}

/// Issue 10, item 4: the CLI must not hang on input no node can accept. A
/// 64 MiB stdin line, and a line one byte above the largest record that
/// fits in one message, fail at once with an error that names the client
/// API's message limit (the old client sent them, tonic refused to encode
/// them, and the failure looked like a transport error that it retried
/// until its deadline); a record above `--max-record` fails at once naming
/// that. Lines that fit one by one but not together are sent in several
/// requests (the old client put up to 256 lines in one request, and hung
/// the same way when they added up to more than the limit).
///
/// The client gets a 10-minute deadline: a client that retries runs into
/// the test's own bound, which is the failure. Nothing here is timed.
#[test]
fn input_no_node_accepts_fails_at_once_naming_the_limit() {
    let c = Cluster::start(
        1,
        &[
            "--ring-capacity",
            "134217728",
            "--max-record",
            &MAX_RECORD.to_string(),
        ],
    );
    let endpoints = c.endpoints();
    lines_above_the_limits_are_refused(&endpoints);
    // Five records of 14 MiB: each fits, together they do not.
    let big: Vec<u8> = (0..5u8).flat_map(|k| line(14 << 20, b'0' + k)).collect();
    let out = cli_bounded(&endpoints, &PATIENT_APPEND, big, BOUND);
    assert!(
        out.status.success(),
        "records that fit one by one: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let indexes: Vec<u64> = lines(&out).iter().map(|l| l.parse().unwrap()).collect();
    assert_eq!(indexes.len(), 5, "an index per record");
    // The node still serves, and holds exactly what was acknowledged: the
    // first short line ("aaaaaaaaaa") was appended before the refusal.
    let out = cli_bounded(&endpoints, &PATIENT_APPEND, b"after\n".to_vec(), BOUND);
    assert!(out.status.success());
    let mut expected: Vec<Vec<u8>> = vec![vec![b'a'; 10]];
    expected.extend((0..5u8).map(|k| vec![b'0' + k; 14 << 20]));
    expected.push(b"after".to_vec());
    assert_log_holds(&endpoints, &expected);
}

/// The client API's message limit, bytes.
const MESSAGE_LIMIT: usize = 64 << 20;
/// ringraft_client::client::MAX_RECORD_BYTES: the message limit less the
/// request's other fields (22 bytes) and the record's tag and length (5
/// bytes).
const LARGEST_RECORD: usize = MESSAGE_LIMIT - 27;
/// The node's `--max-record`, bytes.
const MAX_RECORD: usize = 16 << 20;
/// A slow machine may take long over one big request: never retry it for
/// want of patience.
const PATIENT_APPEND: [&str; 5] = [
    "append",
    "--deadline-ms",
    "600000",
    "--timeout-ms",
    "300000",
];
/// The test's bound on one client call.
const BOUND: Duration = Duration::from_secs(300);

/// A stdin line of `len` bytes `byte`.
fn line(len: usize, byte: u8) -> Vec<u8> {
    let mut l = vec![byte; len];
    l.push(b'\n');
    l
}

/// Lines above the message limit fail naming it, and one above
/// `--max-record` fails naming that.
fn lines_above_the_limits_are_refused(endpoints: &str) {
    for (what, input) in [
        ("a 64 MiB line", line(64 << 20, b'z')),
        (
            "a line one byte above the largest",
            line(LARGEST_RECORD + 1, b'y'),
        ),
        (
            "a short line, then one above the largest",
            [line(10, b'a'), line(LARGEST_RECORD + 1, b'b')].concat(),
        ),
    ] {
        let out = cli_bounded(endpoints, &PATIENT_APPEND, input, BOUND);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what} was accepted");
        assert!(
            stderr.contains(&MESSAGE_LIMIT.to_string()) && stderr.contains("limit"),
            "{what}: the error names the message limit: {stderr}"
        );
    }
    let out = cli_bounded(
        endpoints,
        &PATIENT_APPEND,
        line(MAX_RECORD + 1, b'x'),
        BOUND,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a record above --max-record");
    assert!(stderr.contains("--max-record"), "{stderr}");
}

/// The log read raw through `endpoints` is `expected`, byte for byte.
fn assert_log_holds(endpoints: &str, expected: &[Vec<u8>]) {
    let out = cli_with(
        endpoints,
        &["read", "--format", "raw", "--deadline-ms", "600000"],
        None,
    );
    assert!(out.status.success());
    let records: Vec<&[u8]> = out.stdout.split(|b| *b == b'\n').collect();
    // The last newline is followed by nothing.
    assert_eq!(records.len(), expected.len() + 1, "records read back");
    assert_eq!(records.last(), Some(&&b""[..]));
    for (k, (got, want)) in records.iter().zip(expected).enumerate() {
        assert!(*got == want.as_slice(), "record {k} differs");
    }
}

/// Issue 10, item 4, the other commands: requests no node will ever accept
/// fail at once instead of being retried until the deadline (old code:
/// `members promote` of a non-member and `members remove` of every voter
/// came back as internal errors, which the client retries; `read --follow`
/// of an empty range waited forever). Nothing here is timed: the commands
/// get a 10-minute deadline, and the test's bound is the failure.
#[test]
fn other_commands_with_input_no_node_accepts_fail_at_once() {
    let c = Cluster::start(1, &[]);
    let endpoints = c.endpoints();
    let bound = Duration::from_secs(300);
    for (args, expected) in [
        (
            &["read", "--follow", "--from", "5", "--to", "2"][..],
            "empty",
        ),
        (&["members", "promote", "7"][..], "not a member"),
        (&["members", "remove", "1"][..], "without a voter"),
    ] {
        let args: Vec<&str> = args
            .iter()
            .copied()
            .chain(["--deadline-ms", "600000"])
            .collect();
        let out = cli_bounded(&endpoints, &args, Vec::new(), bound);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    // The node is still whole.
    let members = c.cli(&["members", "list"]);
    assert_eq!(lines(&members), vec![format!("1 {} voter", c.listen(1))]);
}

/// Issue 14, item 3: an AppendStream carries one session with seqs without
/// gaps. A request without a session, or one whose seqs do not go on from
/// the previous request's, ends the stream with INVALID_ARGUMENT after the
/// answers of the requests before it; nothing of it is appended.
#[test]
fn an_append_stream_refuses_requests_outside_its_session() {
    use ringraft_client::api_request;
    use ringraft_client::proto::AppendRequest;
    use ringraft_client::proto::log_client::LogClient;

    let c = Cluster::start(1, &[]);
    let request = |client_id, first_seq, records: &[&str]| AppendRequest {
        client_id,
        first_seq,
        records: records.iter().map(|r| r.as_bytes().to_vec()).collect(),
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let streams = [
        (
            "a gap in the seqs",
            vec![request(5, 1, &["a", "b"]), request(5, 4, &["gap"])],
            1,
            "expected client 5 seq 3",
        ),
        (
            "another session",
            vec![request(6, 1, &["c"]), request(7, 2, &["other"])],
            1,
            "expected client 6 seq 2",
        ),
        ("no session", vec![request(0, 0, &["none"])], 0, "session"),
    ];
    for (what, requests, answered, named) in streams {
        let (answers, error) = runtime.block_on(async {
            let mut client = LogClient::connect(format!("http://{}", c.client(1)))
                .await
                .unwrap();
            let mut stream = client
                .append_stream(api_request(futures::stream::iter(requests)))
                .await
                .unwrap()
                .into_inner();
            let mut answers = Vec::new();
            loop {
                match tokio::time::timeout(BOUND, stream.message()).await {
                    Ok(Ok(Some(answer))) => answers.push(answer.indexes),
                    Ok(Ok(None)) => panic!("{what}: the stream ended without an error"),
                    Ok(Err(status)) => break (answers, status),
                    Err(_) => panic!("{what}: no answer within {BOUND:?}"),
                }
            }
        });
        assert_eq!(answers.len(), answered, "{what}: {answers:?}");
        assert_eq!(
            error.code(),
            tonic::Code::InvalidArgument,
            "{what}: {error}"
        );
        assert!(error.message().contains(named), "{what}: {error}");
    }
    let out = c.cli(&["read", "--format", "raw"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "a\nb\nc\n",
        "only the requests answered were appended"
    );
}
