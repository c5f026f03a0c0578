//! Property tests of `ringraft serve`'s TOML configuration file
//! (`cli/src/daemon/config.rs`), on stable, through the real binary (the
//! crate has no library to call it in): arbitrary text, and valid files
//! with arbitrary values and mutations, never make the daemon panic; the
//! configuration is refused with its one error line.
//!
//! Every run passes `--heartbeat-ms 0`, which a flag checked after the
//! file's keys refuses: the file is read, parsed and checked as far as it
//! goes, and no daemon starts.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use proptest::prelude::*;

/// `ringraft serve --config FILE --heartbeat-ms 0` over `text`.
fn serve_with(dir: &Path, text: &[u8]) -> Output {
    let path = dir.join("node.toml");
    std::fs::write(&path, text).unwrap();
    Command::new(env!("CARGO_BIN_EXE_ringraft"))
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .args(["--heartbeat-ms", "0"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// A refusal, not a panic and not a start.
fn refused(output: &Output) -> Result<String, TestCaseError> {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    prop_assert!(!stderr.contains("panicked"), "{stderr}");
    prop_assert_eq!(output.status.code(), Some(2), "{}", stderr);
    prop_assert!(stderr.starts_with("ringraft: "), "{stderr}");
    Ok(stderr)
}

/// A file whose every key is valid, for `id`, the secret file `secret`.
fn valid_file(id: u64, secret: &Path) -> String {
    format!(
        "id = {id}\n\
         data_dir = \"/tmp/ringraft-decode-props/n{id}\"\n\
         listen = \"127.0.0.1:{port}\"\n\
         client = \"127.0.0.1:1{port}\"\n\
         peers = \"{id}=127.0.0.1:{port},65535=127.0.0.1:9\"\n\
         fabric = \"tcp\"\n\
         durability = \"fsync\"\n\
         ring_capacity = 1048576\n\
         max_record = 4096\n\
         secret_file = \"{secret}\"\n\
         election_timeout_ms = \"150,300\"\n\
         retain_bytes = \"64MiB\"\n\
         retain_age = \"7d\"\n\
         rdma_retry_count = 3\n\
         rdma_ack_timeout_exp = 14\n",
        port = 7000 + id % 1000,
        secret = secret.display(),
    )
}

/// A value for `key`: its valid kind, or anything else TOML holds.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|v| v.to_string()),
        any::<i64>().prop_map(|v| v.to_string()),
        "[a-z0-9:,=. ]{0,24}".prop_map(|s| format!("{s:?}")),
        Just("true".to_string()),
        Just("[1, 2]".to_string()),
        Just("{ a = 1 }".to_string()),
        Just("1.5e300".to_string()),
        Just("\"18446744073709551616EiB\"".to_string()),
        Just("\"0,0\"".to_string()),
        Just("\"99999999999999999999999999d\"".to_string()),
    ]
}

const KEYS: &[&str] = &[
    "id",
    "data_dir",
    "ring_dir",
    "listen",
    "client",
    "peers",
    "bootstrap",
    "fabric",
    "durability",
    "ring_capacity",
    "max_record",
    "metrics",
    "cluster_id",
    "log_format",
    "election_timeout_ms",
    "heartbeat_ms",
    "fast_failover",
    "rdma_retry_count",
    "rdma_ack_timeout_exp",
    "retain_bytes",
    "retain_age",
    "no_such_key",
];

#[test]
fn a_valid_file_is_checked_up_to_the_flag_that_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "a cluster secret of 32 bytes....\n").unwrap();
    let output = serve_with(dir.path(), valid_file(1, &secret).as_bytes());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--heartbeat-ms"), "{stderr}");
}

proptest! {
    // Each case runs the binary.
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn any_file_is_refused_with_an_error_not_a_panic(
        text in proptest::collection::vec(any::<u8>(), 0..200),
        toml_like in "([a-z_]{1,12} = [^\n]{0,20}\n){0,6}",
    ) {
        let dir = tempfile::tempdir().unwrap();
        refused(&serve_with(dir.path(), &text))?;
        refused(&serve_with(dir.path(), toml_like.as_bytes()))?;
    }

    #[test]
    fn valid_files_with_arbitrary_values_and_mutations_are_refused_cleanly(
        id in 1u64..=65535,
        key in 0..KEYS.len(),
        replacement in value(),
        secret_text in proptest::collection::vec(any::<u8>(), 0..40),
        (at, flip, keep) in (any::<usize>(), 1u8.., any::<usize>()),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, &secret_text).unwrap();
        let file = valid_file(id, &secret);
        // One key's value replaced (or added).
        let key = KEYS[key];
        let mut lines: Vec<String> = file
            .lines()
            .filter(|l| !l.starts_with(&format!("{key} =")))
            .map(str::to_string)
            .collect();
        lines.push(format!("{key} = {replacement}"));
        refused(&serve_with(dir.path(), lines.join("\n").as_bytes()))?;
        // One byte flipped, and the file cut short.
        let mut mutated = file.into_bytes();
        let len = mutated.len();
        mutated[at % len] ^= flip;
        mutated.truncate(keep % (len + 1));
        refused(&serve_with(dir.path(), &mutated))?;
    }
}
