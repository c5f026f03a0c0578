//! `ringraft serve`'s configuration: command-line flags and a TOML file with
//! the same keys (flags win). Every value is checked before anything starts;
//! a bad value is a clear error, never a default.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Args;
use serde::Deserialize;

use super::accept::{Caps, MAX_MAX_CONNECTIONS};
use super::tls::{ServerTls, TlsFiles};

/// The flags of `ringraft serve` (every one may also come from the file).
#[derive(Args, Clone, Debug, Default)]
pub struct ServeArgs {
    /// This node's id (1..=65535).
    #[arg(long)]
    pub id: Option<u64>,
    /// Data directory (metadata file, snapshot, the ring's name).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Shared-memory directory the ring lives in (a tmpfs mount; default
    /// /dev/shm).
    #[arg(long)]
    pub ring_dir: Option<PathBuf>,
    /// Control-plane and fabric address (host:port).
    #[arg(long)]
    pub listen: Option<String>,
    /// Client API address (host:port).
    #[arg(long)]
    pub client: Option<String>,
    /// Every initial voter by its --listen address: id=host:port,...
    #[arg(long)]
    pub peers: Option<String>,
    /// Initialize the cluster with --peers as voters (harmless when repeated
    /// or on restart).
    #[arg(long)]
    pub bootstrap: bool,
    /// auto (rdma when available, else tcp), tcp, or rdma.
    #[arg(long)]
    pub fabric: Option<String>,
    /// RDMA device name (e.g. rxe0).
    #[arg(long)]
    pub rdma_device: Option<String>,
    /// memory or fsync.
    #[arg(long)]
    pub durability: Option<String>,
    /// Ring data area capacity in bytes (power of two, >= 1 MiB).
    #[arg(long)]
    pub ring_capacity: Option<u64>,
    /// Largest record, bytes.
    #[arg(long)]
    pub max_record: Option<u64>,
    /// Prometheus metrics and health endpoint (host:port).
    #[arg(long)]
    pub metrics: Option<String>,
    /// File holding the cluster secret (at least 16 bytes).
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// Cluster id (a data directory or peer of another cluster is refused).
    #[arg(long)]
    pub cluster_id: Option<u64>,
    /// Log format: text or json.
    #[arg(long)]
    pub log_format: Option<String>,
    /// Election timeout range in ms: min,max.
    #[arg(long)]
    pub election_timeout_ms: Option<String>,
    /// Heartbeat interval in ms.
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// Replace a leader at once when the fabric confirms it is gone (its
    /// connection ended, its address refuses connections): true (default)
    /// or false. Set false where the network between the nodes may forge
    /// TCP resets (lease reads assume it does not).
    #[arg(long)]
    pub fast_failover: Option<bool>,
    /// rdma queue pairs: transport retries before a request fails (0..=6;
    /// default 6). With --rdma-ack-timeout-exp it bounds how long the device
    /// keeps resending a request nobody acknowledges.
    #[arg(long)]
    pub rdma_retry_count: Option<u8>,
    /// rdma queue pairs: local ACK timeout exponent, 4.096 us x 2^exp per
    /// try (1..=31; default 14, 67 ms).
    #[arg(long)]
    pub rdma_ack_timeout_exp: Option<u8>,
    /// Retention by size: keep at most this much of the log on disk
    /// (e.g. 256MiB, 10GB); the leader trims the oldest records beyond it.
    #[arg(long)]
    pub retain_bytes: Option<String>,
    /// Retention by age: trim segments of the log last written longer ago
    /// than this (e.g. 7d, 12h).
    #[arg(long)]
    pub retain_age: Option<String>,
    /// This node's certificate chain (PEM, its own certificate first) for
    /// the client API and the metrics endpoint: with --tls-key, both serve
    /// TLS only (default: plaintext).
    #[arg(long, value_name = "PEM")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "PEM")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM) on the client
    /// API and the metrics endpoint (needs --tls-cert).
    #[arg(long, value_name = "PEM")]
    pub tls_client_ca: Option<PathBuf>,
    /// Open connections from one IP address (an IPv6 /64) per port (the
    /// client API's, the metrics endpoint's); more are closed at once
    /// (default 256).
    #[arg(long)]
    pub max_connections_per_ip: Option<u32>,
    /// Open connections per port in all; more are closed at once (default
    /// 4096).
    #[arg(long)]
    pub max_connections: Option<u32>,
    /// TOML file with the same keys as the flags (flags win).
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// The TOML file's keys (the flags' names with `_`).
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    id: Option<u64>,
    data_dir: Option<PathBuf>,
    ring_dir: Option<PathBuf>,
    listen: Option<String>,
    client: Option<String>,
    peers: Option<String>,
    bootstrap: Option<bool>,
    fabric: Option<String>,
    rdma_device: Option<String>,
    durability: Option<String>,
    ring_capacity: Option<u64>,
    max_record: Option<u64>,
    metrics: Option<String>,
    secret_file: Option<PathBuf>,
    cluster_id: Option<u64>,
    log_format: Option<String>,
    election_timeout_ms: Option<String>,
    heartbeat_ms: Option<u64>,
    fast_failover: Option<bool>,
    rdma_retry_count: Option<u8>,
    rdma_ack_timeout_exp: Option<u8>,
    retain_bytes: Option<String>,
    retain_age: Option<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_client_ca: Option<PathBuf>,
    max_connections_per_ip: Option<u32>,
    max_connections: Option<u32>,
}

/// The secret used when no --secret-file is given (development only: the
/// daemon warns).
pub const DEV_SECRET: &[u8] = b"ringraft development secret, not for production";

/// Which fabric to use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FabricChoice {
    /// rdma when built with it and a device is active, else tcp.
    Auto,
    /// The software RNIC over TCP.
    Tcp,
    /// Real RDMA.
    Rdma,
}

/// A checked configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub id: u64,
    pub data_dir: PathBuf,
    pub ring_dir: PathBuf,
    pub listen: String,
    pub client: String,
    pub peers: BTreeMap<u64, String>,
    pub bootstrap: bool,
    pub fabric: FabricChoice,
    pub rdma_device: Option<String>,
    pub durability: ringraft::Durability,
    pub ring_capacity: u64,
    pub max_record: u64,
    pub metrics: Option<String>,
    pub secret: Vec<u8>,
    pub cluster_id: u64,
    pub json_logs: bool,
    pub election_timeout_ms: (u64, u64),
    pub heartbeat_ms: u64,
    pub fast_failover: bool,
    /// The rdma queue pairs' retry count and ACK timeout exponent.
    pub rdma_retry: RdmaRetry,
    pub retain_bytes: Option<u64>,
    pub retain_age: Option<std::time::Duration>,
    /// TLS of the client API and the metrics endpoint (`None`: plaintext).
    pub tls: Option<ServerTls>,
    /// The connection caps of each of those ports.
    pub caps: Caps,
}

/// Smallest `--retain-bytes`: one segment's worth would be trimmed as soon
/// as it is written.
pub const MIN_RETAIN_BYTES: u64 = 1 << 20;

/// Parses a byte count with an optional unit (`256MiB`, `10GB`, `4096`).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    s.trim()
        .parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|e| format!("{s:?} is not a byte count (like 256MiB or 10GB): {e}"))
}

/// Parses `id=host:port,...`.
pub fn parse_peers(s: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut peers = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| format!("peer {part:?}: expected id=host:port"))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|e| format!("peer id {id:?}: {e}"))?;
        if id == 0 || id > ringraft_wal::layout::MAX_NODE_ID {
            return Err(format!("peer id {id} is not in 1..=65535"));
        }
        let addr = addr.trim();
        if !addr.contains(':') {
            return Err(format!("peer {id} address {addr:?}: expected host:port"));
        }
        if peers.insert(id, addr.to_string()).is_some() {
            return Err(format!("peer {id} listed twice"));
        }
    }
    Ok(peers)
}

impl ServeArgs {
    /// Merges the file (if any) under the flags, and checks everything.
    pub fn resolve(self) -> Result<Config, String> {
        let file = load_file(self.config.as_deref())?;
        let id = self.id.or(file.id).ok_or("--id is required")?;
        if id == 0 || id > ringraft_wal::layout::MAX_NODE_ID {
            return Err(format!("--id {id} is not in 1..=65535"));
        }
        let data_dir = self
            .data_dir
            .or(file.data_dir)
            .ok_or("--data-dir is required")?;
        let ring_dir = self
            .ring_dir
            .or(file.ring_dir)
            .unwrap_or_else(|| PathBuf::from(ringraft_wal::DEFAULT_RING_DIR));
        if ring_dir.as_os_str().is_empty() {
            return Err("--ring-dir must not be empty".into());
        }
        let listen = self.listen.or(file.listen).ok_or("--listen is required")?;
        let client = self.client.or(file.client).ok_or("--client is required")?;
        let peers = parse_peers(&self.peers.or(file.peers).ok_or("--peers is required")?)?;
        if peers.get(&id).is_some_and(|addr| *addr != listen) {
            return Err(format!(
                "--peers gives node {id} the address {}, but --listen is {listen}",
                peers[&id]
            ));
        }
        let fabric = parse_fabric(self.fabric.or(file.fabric).as_deref())?;
        let durability = parse_durability(self.durability.or(file.durability).as_deref())?;
        let ring_capacity = self
            .ring_capacity
            .or(file.ring_capacity)
            .unwrap_or(64 << 20);
        ringraft_wal::layout::check_capacity(ring_capacity)
            .map_err(|e| format!("--ring-capacity: {e}"))?;
        let max_record = self.max_record.or(file.max_record).unwrap_or(1 << 20);
        if max_record == 0 || max_record > ring_capacity / 4 {
            return Err(format!(
                "--max-record {max_record} must be in 1..={} (a quarter of the ring)",
                ring_capacity / 4
            ));
        }
        let secret = read_secret(self.secret_file.or(file.secret_file))?;
        let json_logs = parse_log_format(self.log_format.or(file.log_format).as_deref())?;
        let election_timeout_ms =
            parse_election_timeout(self.election_timeout_ms.or(file.election_timeout_ms))?;
        let heartbeat_ms = self.heartbeat_ms.or(file.heartbeat_ms).unwrap_or(100);
        if heartbeat_ms == 0 || heartbeat_ms >= election_timeout_ms.0 {
            return Err("--heartbeat-ms must be below the election timeout".into());
        }
        let retain_bytes = parse_retain_bytes(self.retain_bytes.or(file.retain_bytes))?;
        let retain_age = parse_retain_age(self.retain_age.or(file.retain_age))?;
        let rdma_retry = parse_rdma_retry(
            self.rdma_retry_count.or(file.rdma_retry_count),
            self.rdma_ack_timeout_exp.or(file.rdma_ack_timeout_exp),
        )?;
        let tls = parse_tls(
            self.tls_cert.or(file.tls_cert),
            self.tls_key.or(file.tls_key),
            self.tls_client_ca.or(file.tls_client_ca),
        )?;
        let caps = parse_caps(
            self.max_connections_per_ip.or(file.max_connections_per_ip),
            self.max_connections.or(file.max_connections),
        )?;
        Ok(Config {
            id,
            data_dir,
            ring_dir,
            listen,
            client,
            peers,
            bootstrap: self.bootstrap || file.bootstrap.unwrap_or(false),
            fabric,
            rdma_device: self.rdma_device.or(file.rdma_device),
            durability,
            ring_capacity,
            max_record,
            metrics: self.metrics.or(file.metrics),
            secret,
            cluster_id: self.cluster_id.or(file.cluster_id).unwrap_or(0x5249_4e47),
            json_logs,
            election_timeout_ms,
            heartbeat_ms,
            fast_failover: self.fast_failover.or(file.fast_failover).unwrap_or(true),
            rdma_retry,
            retain_bytes,
            retain_age,
            tls,
            caps,
        })
    }
}

/// `--tls-cert`, `--tls-key`, `--tls-client-ca`: none (plaintext), or the
/// certificate and its key (and the client CA), loaded and checked.
fn parse_tls(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
) -> Result<Option<ServerTls>, String> {
    match (cert, key, client_ca) {
        (None, None, None) => Ok(None),
        (Some(cert), Some(key), client_ca) => ServerTls::load(TlsFiles {
            cert,
            key,
            client_ca,
        })
        .map(Some),
        (Some(_), None, _) => Err("--tls-cert needs --tls-key (the certificate's key)".into()),
        (None, Some(_), _) => Err("--tls-key needs --tls-cert".into()),
        (None, None, Some(_)) => Err(
            "--tls-client-ca needs --tls-cert and --tls-key: client certificates are checked \
             in the TLS handshake"
                .into(),
        ),
    }
}

/// `--max-connections-per-ip` and `--max-connections` (defaults:
/// [`Caps::default`]): at least 1, per source no more than in all.
fn parse_caps(per_ip: Option<u32>, total: Option<u32>) -> Result<Caps, String> {
    let default = Caps::default();
    let total = total.unwrap_or(default.total);
    if !(1..=MAX_MAX_CONNECTIONS).contains(&total) {
        return Err(format!(
            "--max-connections {total} must be in 1..={MAX_MAX_CONNECTIONS}"
        ));
    }
    let per_source = per_ip.unwrap_or(default.per_source.min(total));
    if !(1..=total).contains(&per_source) {
        return Err(format!(
            "--max-connections-per-ip {per_source} must be in 1..={total} (--max-connections)"
        ));
    }
    Ok(Caps { per_source, total })
}

/// The TOML file at `path` (none: every key unset). Unknown keys are refused.
fn load_file(path: Option<&std::path::Path>) -> Result<FileConfig, String> {
    match path {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("config {}: {e}", path.display()))?;
            toml::from_str::<FileConfig>(&text)
                .map_err(|e| format!("config {}: {e}", path.display()))
        }
        None => Ok(FileConfig::default()),
    }
}

/// How long an rdma queue pair resends a request nobody acknowledges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaRetry {
    /// Transport retries (also the receiver-not-ready retries).
    pub retry_count: u8,
    /// Local ACK timeout exponent.
    pub ack_timeout_exp: u8,
}

/// `--rdma-retry-count` and `--rdma-ack-timeout-exp` (defaults: the
/// library's).
fn parse_rdma_retry(
    retry_count: Option<u8>,
    ack_timeout_exp: Option<u8>,
) -> Result<RdmaRetry, String> {
    let default = ringraft_transport::ConnConfig::default();
    let retry_count = retry_count.unwrap_or(default.retry_count);
    if retry_count > ringraft_transport::ConnConfig::MAX_RETRY {
        return Err(format!(
            "--rdma-retry-count {retry_count} must be in 0..={} (the device retries forever at 7)",
            ringraft_transport::ConnConfig::MAX_RETRY
        ));
    }
    let ack_timeout_exp = ack_timeout_exp.unwrap_or(default.ack_timeout_exp);
    if !(1..=31).contains(&ack_timeout_exp) {
        return Err(format!(
            "--rdma-ack-timeout-exp {ack_timeout_exp} must be in 1..=31"
        ));
    }
    Ok(RdmaRetry {
        retry_count,
        ack_timeout_exp,
    })
}

/// `--fabric` (default auto).
fn parse_fabric(s: Option<&str>) -> Result<FabricChoice, String> {
    match s.unwrap_or("auto") {
        "auto" => Ok(FabricChoice::Auto),
        "tcp" => Ok(FabricChoice::Tcp),
        "rdma" => Ok(FabricChoice::Rdma),
        other => Err(format!("--fabric {other}: expected auto, tcp or rdma")),
    }
}

/// `--durability` (default memory).
fn parse_durability(s: Option<&str>) -> Result<ringraft::Durability, String> {
    match s.unwrap_or("memory") {
        "memory" => Ok(ringraft::Durability::Memory),
        "fsync" => Ok(ringraft::Durability::Fsync),
        other => Err(format!("--durability {other}: expected memory or fsync")),
    }
}

/// The secret in `path`, trimmed, at least 16 bytes (none: [`DEV_SECRET`]).
fn read_secret(path: Option<PathBuf>) -> Result<Vec<u8>, String> {
    match path {
        Some(path) => {
            let bytes = std::fs::read(&path)
                .map_err(|e| format!("--secret-file {}: {e}", path.display()))?;
            let trimmed = bytes.trim_ascii().to_vec();
            if trimmed.len() < 16 {
                return Err(format!(
                    "--secret-file {}: the secret must be at least 16 bytes",
                    path.display()
                ));
            }
            Ok(trimmed)
        }
        None => Ok(DEV_SECRET.to_vec()),
    }
}

/// `--log-format` (default text): true for json.
fn parse_log_format(s: Option<&str>) -> Result<bool, String> {
    match s.unwrap_or("text") {
        "text" => Ok(false),
        "json" => Ok(true),
        other => Err(format!("--log-format {other}: expected text or json")),
    }
}

/// `--election-timeout-ms min,max` (default 300,600).
fn parse_election_timeout(s: Option<String>) -> Result<(u64, u64), String> {
    let Some(s) = s else {
        return Ok((300, 600));
    };
    let (a, b) = s
        .split_once(',')
        .ok_or("--election-timeout-ms: expected min,max")?;
    let (a, b): (u64, u64) = (
        a.trim()
            .parse()
            .map_err(|e| format!("--election-timeout-ms: {e}"))?,
        b.trim()
            .parse()
            .map_err(|e| format!("--election-timeout-ms: {e}"))?,
    );
    if a == 0 || b <= a {
        return Err("--election-timeout-ms: need 0 < min < max".into());
    }
    Ok((a, b))
}

/// `--retain-bytes` (none: no size retention), at least [`MIN_RETAIN_BYTES`].
fn parse_retain_bytes(s: Option<String>) -> Result<Option<u64>, String> {
    let Some(s) = s else {
        return Ok(None);
    };
    let bytes = parse_bytes(&s).map_err(|e| format!("--retain-bytes: {e}"))?;
    if bytes < MIN_RETAIN_BYTES {
        return Err(format!(
            "--retain-bytes {s}: keep at least {MIN_RETAIN_BYTES} bytes (1 MiB)"
        ));
    }
    Ok(Some(bytes))
}

/// `--retain-age` (none: no age retention), above zero.
fn parse_retain_age(s: Option<String>) -> Result<Option<std::time::Duration>, String> {
    let Some(s) = s else {
        return Ok(None);
    };
    let age = humantime::parse_duration(s.trim())
        .map_err(|e| format!("--retain-age {s:?} is not a duration (like 7d or 12h): {e}"))?;
    if age.is_zero() {
        return Err(format!("--retain-age {s}: must be above zero"));
    }
    Ok(Some(age))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn base() -> ServeArgs {
        ServeArgs {
            id: Some(1),
            data_dir: Some("/tmp/x".into()),
            listen: Some("127.0.0.1:7001".into()),
            client: Some("127.0.0.1:8001".into()),
            peers: Some("1=127.0.0.1:7001,2=127.0.0.1:7002".into()),
            ..Default::default()
        }
    }

    #[test]
    fn peers_parse_and_reject_garbage() {
        assert_eq!(parse_peers("1=a:1, 2=b:2").unwrap().len(), 2);
        for bad in [
            "1",
            "x=a:1",
            "0=a:1",
            "1=a:1,1=b:2",
            "1=nohost",
            "70000=a:1",
        ] {
            assert!(parse_peers(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn flags_resolve_and_bad_values_are_errors() {
        let c = base().resolve().unwrap();
        assert_eq!(c.peers.len(), 2);
        assert_eq!(c.ring_dir, Path::new("/dev/shm"), "the default ring dir");
        assert_eq!(c.fabric, FabricChoice::Auto);
        for (field, bad) in [
            (
                "fabric",
                ServeArgs {
                    fabric: Some("udp".into()),
                    ..base()
                },
            ),
            (
                "durability",
                ServeArgs {
                    durability: Some("sometimes".into()),
                    ..base()
                },
            ),
            (
                "ring",
                ServeArgs {
                    ring_capacity: Some(3 << 20),
                    ..base()
                },
            ),
            (
                "record",
                ServeArgs {
                    max_record: Some(1 << 40),
                    ..base()
                },
            ),
            (
                "id",
                ServeArgs {
                    id: Some(0),
                    ..base()
                },
            ),
            (
                "listen",
                ServeArgs {
                    listen: Some("127.0.0.1:9".into()),
                    ..base()
                },
            ),
            (
                "rdma retry count",
                ServeArgs {
                    rdma_retry_count: Some(7),
                    ..base()
                },
            ),
            (
                "rdma ack timeout",
                ServeArgs {
                    rdma_ack_timeout_exp: Some(0),
                    ..base()
                },
            ),
            (
                "rdma ack timeout",
                ServeArgs {
                    rdma_ack_timeout_exp: Some(32),
                    ..base()
                },
            ),
        ] {
            assert!(bad.resolve().is_err(), "{field}");
        }
    }

    #[test]
    fn rdma_retry_defaults_to_the_library_and_takes_flags_and_file() {
        let library = ringraft_transport::ConnConfig::default();
        let c = base().resolve().unwrap();
        assert_eq!(c.rdma_retry.retry_count, library.retry_count);
        assert_eq!(c.rdma_retry.ack_timeout_exp, library.ack_timeout_exp);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n.toml");
        std::fs::write(&path, "rdma_retry_count = 3\nrdma_ack_timeout_exp = 12\n").unwrap();
        let from_file = ServeArgs {
            config: Some(path.clone()),
            ..base()
        }
        .resolve()
        .unwrap();
        assert_eq!(
            from_file.rdma_retry,
            RdmaRetry {
                retry_count: 3,
                ack_timeout_exp: 12
            }
        );
        let flag_wins = ServeArgs {
            config: Some(path),
            rdma_ack_timeout_exp: Some(19),
            ..base()
        }
        .resolve()
        .unwrap();
        assert_eq!(flag_wins.rdma_retry.ack_timeout_exp, 19);
        assert_eq!(flag_wins.rdma_retry.retry_count, 3);
    }

    /// `--tls-cert` and `--tls-key` come together, `--tls-client-ca` needs
    /// them, the files are checked at once, and the file's keys work like
    /// the flags.
    #[test]
    fn tls_flags_come_in_pairs_and_are_checked_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let node = crate::demo::certs::Ca::new("ca")
            .unwrap()
            .write(dir.path(), "node")
            .unwrap();
        assert!(
            base().resolve().unwrap().tls.is_none(),
            "plaintext by default"
        );
        let with = |cert: Option<&Path>, key: Option<&Path>, client_ca: Option<&Path>| ServeArgs {
            tls_cert: cert.map(Into::into),
            tls_key: key.map(Into::into),
            tls_client_ca: client_ca.map(Into::into),
            ..base()
        };
        let c = with(Some(&node.cert), Some(&node.key), None)
            .resolve()
            .unwrap();
        assert!(c.tls.is_some_and(|t| !t.client_auth()));
        let c = with(Some(&node.cert), Some(&node.key), Some(&node.ca))
            .resolve()
            .unwrap();
        assert!(c.tls.is_some_and(|t| t.client_auth()));
        let missing = dir.path().join("missing.pem");
        for (what, args, expected) in [
            (
                "cert alone",
                with(Some(&node.cert), None, None),
                "--tls-cert needs --tls-key",
            ),
            (
                "key alone",
                with(None, Some(&node.key), None),
                "--tls-key needs --tls-cert",
            ),
            (
                "client ca alone",
                with(None, None, Some(&node.ca)),
                "--tls-client-ca needs",
            ),
            (
                "missing cert",
                with(Some(&missing), Some(&node.key), None),
                "missing.pem",
            ),
            (
                "missing client ca",
                with(Some(&node.cert), Some(&node.key), Some(&missing)),
                "--tls-client-ca",
            ),
        ] {
            let err = args.resolve().unwrap_err();
            assert!(err.contains(expected), "{what}: {err}");
        }
        let path = dir.path().join("n.toml");
        std::fs::write(
            &path,
            format!(
                "tls_cert = {:?}\ntls_key = {:?}\ntls_client_ca = {:?}\n",
                node.cert, node.key, node.ca
            ),
        )
        .unwrap();
        let c = ServeArgs {
            config: Some(path),
            ..base()
        }
        .resolve()
        .unwrap();
        assert!(c.tls.is_some_and(|t| t.client_auth()), "from the file");
    }

    #[test]
    fn connection_caps_default_take_flags_and_file_and_are_checked() {
        let c = base().resolve().unwrap();
        assert_eq!(c.caps, Caps::default());
        assert_eq!((c.caps.per_source, c.caps.total), (256, 4096));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n.toml");
        std::fs::write(&path, "max_connections_per_ip = 8\nmax_connections = 100\n").unwrap();
        let c = ServeArgs {
            config: Some(path.clone()),
            max_connections: Some(50),
            ..base()
        }
        .resolve()
        .unwrap();
        assert_eq!(
            c.caps,
            Caps {
                per_source: 8,
                total: 50
            },
            "the flag wins"
        );
        let small = ServeArgs {
            max_connections: Some(10),
            ..base()
        }
        .resolve()
        .unwrap();
        assert_eq!(
            small.caps.per_source, 10,
            "the default per IP fits the total"
        );
        for (per_ip, total) in [
            (Some(0), None),
            (None, Some(0)),
            (Some(11), Some(10)),
            (None, Some(u32::MAX)),
        ] {
            let err = ServeArgs {
                max_connections_per_ip: per_ip,
                max_connections: total,
                ..base()
            }
            .resolve()
            .unwrap_err();
            assert!(
                err.contains("--max-connections"),
                "{per_ip:?} {total:?}: {err}"
            );
        }
    }

    #[test]
    fn the_file_fills_in_and_flags_win() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n.toml");
        std::fs::write(
            &path,
            "id = 2\ndata_dir = \"/tmp/n2\"\nlisten = \"127.0.0.1:7002\"\nclient = \"127.0.0.1:8002\"\npeers = \"1=127.0.0.1:7001,2=127.0.0.1:7002\"\ndurability = \"fsync\"\nring_dir = \"/mnt/ring-tmpfs\"\n",
        )
        .unwrap();
        let c = ServeArgs {
            config: Some(path.clone()),
            durability: Some("memory".into()),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(c.id, 2);
        assert_eq!(c.durability, ringraft::Durability::Memory, "the flag wins");
        assert_eq!(
            c.ring_dir,
            Path::new("/mnt/ring-tmpfs"),
            "ring_dir from the file"
        );
        std::fs::write(&path, "id = 2\nnot_a_key = 1\n").unwrap();
        let err = ServeArgs {
            config: Some(path),
            ..Default::default()
        }
        .resolve()
        .unwrap_err();
        assert!(err.contains("unknown field"), "{err}");
    }
}
