//! The command line of one `ringraft serve` node. Owns the flag names and
//! the harnesses' defaults (8 MiB ring, 64 KiB records); never starts a
//! process and never reads the environment.

use std::path::PathBuf;

/// Ring capacity of a harness node, bytes.
pub const RING_CAPACITY_BYTES: u64 = 8 << 20;
/// Largest record of a harness node, bytes.
pub const MAX_RECORD_BYTES: u64 = 65_536;

/// What `ringraft serve` is told about one node.
#[derive(Debug, Clone)]
pub struct ServeArgs {
    /// `--id`.
    pub id: u64,
    /// `--data-dir`.
    pub data_dir: PathBuf,
    /// `--ring-dir` (`None`: the daemon's default, /dev/shm).
    pub ring_dir: Option<PathBuf>,
    /// `--listen` (control plane).
    pub listen: String,
    /// `--client` (client API).
    pub client: String,
    /// `--metrics`, if any.
    pub metrics: Option<String>,
    /// `--peers` (see [`peers_arg`]).
    pub peers: String,
    /// `--fabric` (`tcp`, `rdma`).
    pub fabric: String,
    /// `--ring-capacity`, bytes.
    pub ring_capacity_bytes: u64,
    /// `--max-record`, bytes.
    pub max_record_bytes: u64,
    /// `--bootstrap`.
    pub bootstrap: bool,
    /// More flags, last; an option given here replaces its value above.
    pub extra: Vec<String>,
}

impl ServeArgs {
    /// A node with the harness defaults: no ring dir, no metrics, no
    /// bootstrap, no extra flags.
    pub fn new(
        id: u64,
        data_dir: PathBuf,
        listen: &str,
        client: &str,
        peers: &str,
        fabric: &str,
    ) -> ServeArgs {
        ServeArgs {
            id,
            data_dir,
            ring_dir: None,
            listen: listen.into(),
            client: client.into(),
            metrics: None,
            peers: peers.into(),
            fabric: fabric.into(),
            ring_capacity_bytes: RING_CAPACITY_BYTES,
            max_record_bytes: MAX_RECORD_BYTES,
            bootstrap: false,
            extra: Vec::new(),
        }
    }

    /// The arguments, starting with `serve`.
    pub fn to_args(&self) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--id".into(),
            self.id.to_string(),
            "--data-dir".into(),
            self.data_dir.display().to_string(),
            "--listen".into(),
            self.listen.clone(),
            "--client".into(),
            self.client.clone(),
            "--peers".into(),
            self.peers.clone(),
            "--fabric".into(),
            self.fabric.clone(),
            "--ring-capacity".into(),
            self.ring_capacity_bytes.to_string(),
            "--max-record".into(),
            self.max_record_bytes.to_string(),
        ];
        if let Some(ring_dir) = &self.ring_dir {
            args.extend(["--ring-dir".into(), ring_dir.display().to_string()]);
        }
        if let Some(metrics) = &self.metrics {
            args.extend(["--metrics".into(), metrics.clone()]);
        }
        // Every option above takes a value: one named in `extra` replaces it.
        for flag in self.extra.iter().filter(|a| a.starts_with("--")) {
            if let Some(k) = args.iter().position(|a| a == flag) {
                args.drain(k..=k + 1);
            }
        }
        if self.bootstrap && !self.extra.iter().any(|a| a == "--bootstrap") {
            args.push("--bootstrap".into());
        }
        args.extend(self.extra.iter().cloned());
        args
    }
}

/// `--peers`: `id=addr` pairs joined by commas.
pub fn peers_arg<'a>(peers: impl IntoIterator<Item = (u64, &'a str)>) -> String {
    peers
        .into_iter()
        .map(|(id, addr)| format!("{id}={addr}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_options_replace_their_defaults() {
        let mut args = ServeArgs::new(1, "/d".into(), "a:1", "a:2", "1=a:1", "tcp");
        args.bootstrap = true;
        args.extra = vec!["--max-record".into(), "4096".into()];
        let line = args.to_args().join(" ");
        assert_eq!(
            line,
            "serve --id 1 --data-dir /d --listen a:1 --client a:2 --peers 1=a:1 \
             --fabric tcp --ring-capacity 8388608 --bootstrap --max-record 4096"
        );
        assert_eq!(peers_arg([(1, "a:1"), (2, "b:2")]), "1=a:1,2=b:2");
    }
}
