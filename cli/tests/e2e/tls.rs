//! TLS on the client API and the metrics endpoint (issue 15, item 3), and
//! the caps of the client-facing ports' accept loop (item 1): nodes with
//! `--tls-cert`/`--tls-key` (and `--tls-client-ca`) serve the CLI given
//! `--ca` (and `--cert`/`--key`) and metrics over https; a plaintext
//! client, a client that does not trust the node's CA, and (where client
//! certificates are required) a client without a certificate or with one
//! of another CA are refused with an error that says why; bad TLS files
//! stop `serve` and the CLI at once; `ringraft demo --tls` passes.
//!
//! The certificates are made here with rcgen, for `127.0.0.1` (the nodes
//! are dialled by IP address), in the test's temporary directory.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use ringraft_testkit::leader::{NodeView, Observe, Wanted, wait_for_leader};

use crate::harness::*;

/// A CA made for the test.
struct Ca {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
}

/// Where a CA and a certificate it signed were written.
#[derive(Clone)]
struct Files {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// Writes this CA's certificate and a new certificate for `names`
    /// (and its key) into `dir` under `<prefix>-*.pem`.
    fn write(&self, dir: &Path, prefix: &str, names: &[&str]) -> Files {
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let files = Files {
            ca: dir.join(format!("{prefix}-ca.pem")),
            cert: dir.join(format!("{prefix}-cert.pem")),
            key: dir.join(format!("{prefix}-key.pem")),
        };
        std::fs::write(&files.ca, &self.pem).unwrap();
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    }
}

fn arg(path: &Path) -> String {
    path.display().to_string()
}

/// The TLS material of a test: the nodes' CA and certificate, a client
/// certificate of the same CA, and a stranger: a CA and certificate of
/// its own.
struct Material {
    _dir: tempfile::TempDir,
    node: Files,
    client: Files,
    stranger: Files,
}

impl Material {
    fn new() -> Material {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("ringraft test CA");
        let node = ca.write(dir.path(), "node", &["127.0.0.1", "localhost"]);
        let client = ca.write(dir.path(), "client", &["client"]);
        let stranger = Ca::new("another CA").write(dir.path(), "stranger", &["127.0.0.1"]);
        Material {
            _dir: dir,
            node,
            client,
            stranger,
        }
    }

    /// `serve`'s TLS flags (`--tls-client-ca` when `client_certs`).
    fn serve_args(&self, client_certs: bool) -> Vec<String> {
        let mut args = vec![
            "--tls-cert".into(),
            arg(&self.node.cert),
            "--tls-key".into(),
            arg(&self.node.key),
        ];
        if client_certs {
            args.extend(["--tls-client-ca".into(), arg(&self.node.ca)]);
        }
        args
    }

    /// A client's flags: the nodes' CA, and with `cert`, its certificate.
    fn client_args(&self, cert: Option<&Files>) -> Vec<String> {
        let mut args = vec!["--ca".into(), arg(&self.node.ca)];
        if let Some(files) = cert {
            args.extend([
                "--cert".into(),
                arg(&files.cert),
                "--key".into(),
                arg(&files.key),
            ]);
        }
        args
    }
}

/// A cluster whose nodes serve TLS: the harness's cluster, watched (and
/// driven) with the client flags `client`.
struct TlsCluster {
    c: Cluster,
    client: Vec<String>,
}

impl TlsCluster {
    /// `n` nodes with the TLS flags `serve`, started, a leader agreed
    /// (asked with the client flags `client`).
    fn start(n: u64, serve: Vec<String>, client: Vec<String>) -> TlsCluster {
        let serve: Vec<&str> = serve.iter().map(String::as_str).collect();
        let c = Cluster::new(n, &serve);
        for id in 1..=n {
            c.boot(id);
        }
        let tls = TlsCluster { c, client };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let wanted = Wanted::any(Duration::from_millis(100));
        if let Err(e) = runtime.block_on(wait_for_leader(&tls, &wanted, Duration::from_secs(60))) {
            panic!("no agreed leader over TLS: {e}");
        }
        tls
    }

    /// `ringraft <args>` with the cluster's client flags (and `extra`
    /// client flags instead, when given) against `endpoints`.
    fn cli(
        &self,
        endpoints: &str,
        args: &[&str],
        extra: Option<&[String]>,
        stdin: Option<&str>,
    ) -> Output {
        let flags = extra.unwrap_or(&self.client);
        let args: Vec<&str> = args
            .iter()
            .copied()
            .chain(flags.iter().map(String::as_str))
            .collect();
        cli_with(endpoints, &args, stdin)
    }
}

impl Observe for TlsCluster {
    fn running(&self) -> Vec<u64> {
        Observe::running(&self.c)
    }

    async fn view(&self, id: u64) -> Option<NodeView> {
        let out = self.cli(
            &self.c.client(id),
            &["status", "--json", "--timeout-ms", "1000"],
            None,
            None,
        );
        if !out.status.success() {
            return None;
        }
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        Some(NodeView {
            id,
            term: s["term"].as_u64()?,
            leader: s["leader_id"].as_u64(),
            is_leader: s["state"].as_str() == Some("Leader"),
        })
    }

    fn failed(&self) -> Option<String> {
        Observe::failed(&self.c)
    }
}

/// What a failed command said; fails the test if it succeeded.
fn refusal(out: &Output, what: &str) -> String {
    assert!(
        !out.status.success(),
        "{what}: accepted: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(out.status.code(), Some(2), "{what}: the error exit code");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{what}: {err}");
    err
}

/// `GET path` over https from `addr`, trusting `ca`, presenting `client`
/// when given: the answer's status line and body, or the error.
fn https_get(addr: &str, path: &str, ca: &Path, client: Option<&Files>) -> Result<String, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca).unwrap())
        .unwrap();
    let builder =
        rustls::ClientConfig::builder_with_provider(ringraft_client::tls::crypto_provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
    let mut config = match client {
        Some(files) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_file(&files.cert).unwrap()],
                PrivateKeyDer::from_pem_file(&files.key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let host = addr.rsplit_once(':').unwrap().0.to_string();
    let session =
        rustls::ClientConnection::new(Arc::new(config), ServerName::try_from(host).unwrap())
            .map_err(|e| e.to_string())?;
    let tcp = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut tls = rustls::StreamOwned::new(session, tcp);
    tls.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: ringraft\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    match tls.read_to_string(&mut answer) {
        Ok(_) => Ok(answer),
        // A server that closes without close_notify after a complete
        // answer is fine.
        Err(_) if answer.contains("\r\n\r\n") => Ok(answer),
        Err(e) => Err(e.to_string()),
    }
}

/// `GET path` in plaintext from `addr`: the whole answer.
fn http_get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: ringraft\r\n\r\n").as_bytes())
        .unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text
}

/// Three nodes with TLS (no client certificates): the CLI with `--ca`
/// appends and reads through every node; a plaintext client and a client
/// that trusts another CA are refused with an error that says why, at
/// once (the refusal is not retried until the deadline); metrics answer
/// over https, and a plaintext scrape is told to use https.
#[test]
fn the_cli_and_metrics_work_over_tls_and_plaintext_is_refused() {
    let tls = Material::new();
    let c = TlsCluster::start(3, tls.serve_args(false), tls.client_args(None));
    let endpoints = c.c.endpoints();
    let records: Vec<String> = (0..5).map(|k| format!("tls record {k}")).collect();
    let out = c.cli(
        &endpoints,
        &["append"],
        None,
        Some(&(records.join("\n") + "\n")),
    );
    assert_ok(&out);
    assert_eq!(lines(&out).len(), 5, "one index per record");
    for id in c.c.ids() {
        let out = c.cli(
            &c.c.client(id),
            &["read", "--from", "1", "--format", "json"],
            None,
            None,
        );
        assert_ok(&out);
        let data: Vec<String> = lines(&out)
            .iter()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["data"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(data, records, "node {id} over TLS");
    }

    // A plaintext client: the node answers that it wants TLS, and the
    // client says to give --ca (long deadline: it must not be waited out).
    let plaintext: Vec<String> = vec![];
    let out = c.cli(
        &endpoints,
        &["status", "--deadline-ms", "3600000"],
        Some(&plaintext),
        None,
    );
    let err = refusal(&out, "a plaintext client");
    assert!(
        err.contains("serves TLS only") && err.contains("--ca"),
        "{err}"
    );
    // The same from stdin: pipelined appends over one stream.
    let out = c.cli(
        &endpoints,
        &["append", "--deadline-ms", "3600000"],
        Some(&plaintext),
        Some("not sent\n"),
    );
    let err = refusal(&out, "a plaintext stream of appends");
    assert!(err.contains("serves TLS only"), "{err}");
    // A client that trusts another CA refuses the nodes' certificate.
    let other_ca = vec!["--ca".to_string(), arg(&tls.stranger.ca)];
    let out = c.cli(
        &endpoints,
        &["append", "x", "--deadline-ms", "3600000"],
        Some(&other_ca),
        None,
    );
    let err = refusal(&out, "a client of another CA");
    assert!(
        err.contains("TLS failed") && err.contains("not signed by --ca"),
        "{err}"
    );

    // Metrics over https with the CA; plaintext is told to use https.
    let metrics = c.c.metrics(1);
    let answer = https_get(&metrics, "/metrics", &tls.node.ca, None).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("ringraft_term "), "{answer}");
    assert!(
        answer.contains(
            "ringraft_connections_dropped_before_auth_total{port=\"client\",reason=\"plaintext\"}"
        ),
        "{answer}"
    );
    let answer = http_get(&metrics, "/metrics");
    assert!(
        answer.starts_with("HTTP/1.1 400") && answer.contains("HTTPS only"),
        "{answer}"
    );
    assert!(
        https_get(&metrics, "/metrics", &tls.stranger.ca, None).is_err(),
        "a scraper that trusts another CA refuses the node"
    );
}

/// With `--tls-client-ca`: a client with a certificate of that CA is
/// served (CLI and metrics); a client without a certificate, or with one
/// of another CA, is refused with an error that says so.
#[test]
fn client_certificates_are_required_with_tls_client_ca() {
    let tls = Material::new();
    let c = TlsCluster::start(1, tls.serve_args(true), tls.client_args(Some(&tls.client)));
    let endpoints = c.c.endpoints();
    let out = c.cli(&endpoints, &["append", "with a certificate"], None, None);
    assert_ok(&out);
    let out = c.cli(&endpoints, &["read", "--from", "1"], None, None);
    assert_ok(&out);
    assert_eq!(lines(&out), vec!["with a certificate"]);

    let long = ["--deadline-ms", "3600000"];
    let no_cert = tls.client_args(None);
    let out = c.cli(
        &endpoints,
        &["append", "x", long[0], long[1]],
        Some(&no_cert),
        None,
    );
    let err = refusal(&out, "a client without a certificate");
    assert!(err.contains("requires a client certificate"), "{err}");
    let stranger = vec![
        "--ca".to_string(),
        arg(&tls.node.ca),
        "--cert".into(),
        arg(&tls.stranger.cert),
        "--key".into(),
        arg(&tls.stranger.key),
    ];
    let out = c.cli(
        &endpoints,
        &["status", long[0], long[1]],
        Some(&stranger),
        None,
    );
    let err = refusal(&out, "a client with another CA's certificate");
    assert!(err.contains("TLS failed"), "{err}");
    // Nothing of theirs got in.
    let out = c.cli(&endpoints, &["read", "--from", "1"], None, None);
    assert_eq!(lines(&out), vec!["with a certificate"]);

    let metrics = c.c.metrics(1);
    let answer = https_get(&metrics, "/metrics", &tls.node.ca, Some(&tls.client)).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let dropped =
        "ringraft_connections_dropped_before_auth_total{port=\"client\",reason=\"tls_failed\"}";
    let count = answer
        .lines()
        .find_map(|l| l.strip_prefix(dropped))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no {dropped} in:\n{answer}"));
    assert!(count >= 2, "the two refused clients were counted: {count}");
    // TLS 1.3: the scraper learns of the refusal when it reads, so it may
    // see an error or no answer at all.
    let scrape = https_get(&metrics, "/metrics", &tls.node.ca, None);
    let refused = match &scrape {
        Err(_) => true,
        Ok(answer) => !answer.starts_with("HTTP/"),
    };
    assert!(
        refused,
        "a scrape without a client certificate is refused: {scrape:?}"
    );
}

/// Bad TLS files stop `serve` before anything starts, and the CLI at once,
/// with an error naming the flag and the file; never a panic.
#[test]
fn bad_tls_files_are_clear_errors() {
    let tls = Material::new();
    let missing = tls.node.cert.with_file_name("missing.pem");
    for (what, flags, expected) in [
        (
            "a missing certificate",
            vec![
                "--tls-cert",
                missing.to_str().unwrap(),
                "--tls-key",
                tls.node.key.to_str().unwrap(),
            ],
            "missing.pem",
        ),
        (
            "another certificate's key",
            vec![
                "--tls-cert",
                tls.node.cert.to_str().unwrap(),
                "--tls-key",
                tls.stranger.key.to_str().unwrap(),
            ],
            "does not go with",
        ),
        (
            "a key for a certificate",
            vec![
                "--tls-cert",
                tls.node.key.to_str().unwrap(),
                "--tls-key",
                tls.node.key.to_str().unwrap(),
            ],
            "no certificate",
        ),
        (
            "a client CA without a certificate",
            vec!["--tls-client-ca", tls.node.ca.to_str().unwrap()],
            "--tls-client-ca needs",
        ),
    ] {
        let err = refused_serve(&flags);
        assert!(
            err.contains(expected) && !err.contains("panicked"),
            "{what}: {err}"
        );
    }
    for (what, flags, expected) in [
        (
            "a missing CA",
            vec!["--ca", missing.to_str().unwrap()],
            "missing.pem",
        ),
        (
            "a key as the CA",
            vec!["--ca", tls.node.key.to_str().unwrap()],
            "no certificate",
        ),
        (
            "another certificate's key",
            vec![
                "--ca",
                tls.node.ca.to_str().unwrap(),
                "--cert",
                tls.client.cert.to_str().unwrap(),
                "--key",
                tls.stranger.key.to_str().unwrap(),
            ],
            "does not go with",
        ),
    ] {
        let args: Vec<&str> = ["status"].into_iter().chain(flags).collect();
        let out = cli_with("127.0.0.1:1", &args, None);
        let err = refusal(&out, what);
        assert!(err.contains(expected), "{what}: {err}");
    }
    // --cert needs --key (and --ca): a usage error.
    let out = cli_with(
        "127.0.0.1:1",
        &["status", "--cert", tls.client.cert.to_str().unwrap()],
        None,
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--key"));
}

/// Issue 15, item 1, through a real daemon: with `--max-connections-per-ip
/// 1`, a second connection from the same address to the client API is
/// closed at once while the first stays open, and the refusal is counted
/// in the metrics.
#[test]
fn connections_beyond_the_cap_are_closed_and_counted() {
    let c = Cluster::start(1, &["--max-connections-per-ip", "1"]);
    // One connection that the server serves: it answers the HTTP/2 preface
    // with its SETTINGS. (Until the connections of the start-up's status
    // calls are gone, a new one is refused: try again.)
    let _served = loop {
        if let Some(s) = http2_served(&c.client(1)) {
            break s;
        }
    };
    let mut second = TcpStream::connect(c.client(1)).unwrap();
    // The timeout only keeps a broken node from hanging the test.
    second
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut byte = [0u8; 1];
    let read = second.read(&mut byte);
    assert!(
        matches!(read, Ok(0)),
        "closed at once, not left open: {read:?}"
    );
    let text = http_get(&c.metrics(1), "/metrics");
    let refused = "ringraft_connections_refused_total{port=\"client\",reason=\"per_ip_cap\"} ";
    let count = text
        .lines()
        .find_map(|l| l.strip_prefix(refused))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no {refused} in:\n{text}"));
    assert!(count >= 1, "{text}");
    // A client from the same address is refused too while the first is
    // open, and served once it closed.
    drop(_served);
    let out = c.cli(&["append", "after the cap"]);
    assert_ok(&out);
}

/// A connection to `addr` that the server serves: after the HTTP/2
/// preface, its first frame is a SETTINGS frame. `None` if it was closed.
fn http2_served(addr: &str) -> Option<TcpStream> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .ok()?;
    let mut header = [0u8; 9];
    s.read_exact(&mut header).ok()?;
    assert_eq!(header[3], 4, "the server's first frame is SETTINGS");
    Some(s)
}

/// `ringraft demo --tls` passes: a CA made on the spot, client
/// certificates required, the refusals shown, every check passed.
#[test]
fn the_demo_passes_with_tls() {
    let dir = tempfile::tempdir().unwrap();
    let demo_dir = dir.path().join("demo");
    let out = run_bounded(
        &[
            "demo",
            "--tls",
            "--dir",
            demo_dir.to_str().unwrap(),
            "--step-timeout",
            "300",
        ],
        Duration::from_secs(900),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo --tls failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("PASS"), "{stdout}");
    assert!(
        stdout.contains("without a certificate is refused"),
        "{stdout}"
    );
    assert!(stdout.contains("a plaintext client is refused"), "{stdout}");
    assert!(demo_dir.join("tls/ca.pem").is_file());
    let left = processes_mentioning(demo_dir.to_str().unwrap());
    assert!(left.is_empty(), "the demo left processes running: {left:?}");
}
