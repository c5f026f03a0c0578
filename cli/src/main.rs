//! `ringraft`: the replicated-log daemon and its command-line client.
//!
//! This file owns the entry point only: it parses the command line
//! (`args`), sets the process up (SIGPIPE, the runtime) and dispatches to
//! `commands/`. It must never hold a command's logic itself.

mod args;
mod commands;
mod daemon;
mod demo;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use args::{Cli, Command};

async fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Serve(args) => commands::serve::run(*args).await,
        Command::Append { endpoints, data } => commands::append::run(endpoints, data).await,
        Command::Read(args) => commands::read::run(args).await,
        Command::Status { endpoints, json } => commands::status::run(endpoints, json).await,
        Command::Members { action } => commands::members::run(action).await,
        Command::Trim { endpoints, before } => commands::trim::run(endpoints, before).await,
        Command::Transfer { endpoints, to } => commands::transfer::run(endpoints, to).await,
        Command::Bench(args) => commands::bench::command(args).await,
        Command::Demo {
            dir,
            records,
            step_timeout,
            durability,
            tls,
        } => {
            demo::run(demo::DemoConfig {
                dir,
                records,
                step_timeout: Duration::from_secs(step_timeout.clamp(1, 3600)),
                durability,
                tls,
            })
            .await
        }
        Command::Wal { action } => commands::wal::run(action),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_) | Command::Demo { .. }) {
        // A client command is a Unix filter: `ringraft read ... | head` ends
        // quietly when the reader goes away, instead of failing to print.
        // (The daemon keeps SIGPIPE ignored: it writes to sockets; the demo
        // too: it must stop its nodes.)
        // SAFETY: called before any other thread exists; SIG_DFL is a valid
        // disposition for SIGPIPE.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return commands::fail(format!("tokio runtime: {e}")),
    };
    runtime.block_on(run(cli))
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    fn deploy() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
    }

    /// deploy/config/node{1,2,3}.toml load through `serve`'s own loader and
    /// describe one cluster.
    #[test]
    fn the_example_configs_load_through_the_real_loader() {
        let dir = tempfile::tempdir().unwrap();
        // The files name /etc/ringraft/secret; the flag (which wins) points
        // at a stand-in so that the test needs no /etc.
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "a test secret of more than 16 bytes\n").unwrap();
        let mut configs = Vec::new();
        for id in 1..=3u64 {
            let path = deploy().join(format!("config/node{id}.toml"));
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                text.contains("secret_file = \"/etc/ringraft/secret\""),
                "{}",
                path.display()
            );
            let c = crate::daemon::config::ServeArgs {
                config: Some(path.clone()),
                secret_file: Some(secret.clone()),
                ..Default::default()
            }
            .resolve()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(c.id, id);
            assert_eq!(c.bootstrap, id == 1, "only node 1 bootstraps");
            assert_eq!(c.durability, ringraft::Durability::Fsync);
            assert_eq!(c.fabric, crate::daemon::config::FabricChoice::Auto);
            assert_eq!(c.peers.len(), 3);
            assert_eq!(c.peers[&id], c.listen);
            assert_eq!(c.data_dir, Path::new("/var/lib/ringraft"));
            assert_eq!(c.ring_dir, Path::new("/dev/shm"));
            assert!(c.metrics.is_some());
            assert_ne!(c.secret, crate::daemon::config::DEV_SECRET);
            assert!(c.tls.is_none(), "TLS is commented out: it needs files");
            assert_eq!(c.caps, crate::daemon::accept::Caps::default());
            configs.push(c);
        }
        assert!(
            configs
                .windows(2)
                .all(|w| w[0].peers == w[1].peers && w[0].cluster_id == w[1].cluster_id),
            "one cluster: the same peers and cluster id everywhere"
        );
    }

    /// The TLS keys of deploy/config/node{1,2,3}.toml (commented out: they
    /// name files an operator makes) load through the real loader once
    /// uncommented, with the files they name stood in for by test ones.
    #[test]
    fn the_example_configs_tls_keys_load_when_uncommented() {
        let dir = tempfile::tempdir().unwrap();
        let node = crate::demo::certs::Ca::new("ca")
            .unwrap()
            .write(dir.path(), "node")
            .unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "a test secret of more than 16 bytes\n").unwrap();
        for id in 1..=3u64 {
            let path = deploy().join(format!("config/node{id}.toml"));
            let text = std::fs::read_to_string(&path).unwrap();
            let mut uncommented = 0;
            let text: String = text
                .lines()
                .map(|line| match line.strip_prefix("# tls_") {
                    Some(rest) => {
                        uncommented += 1;
                        let (key, _) = rest.split_once(" = ").unwrap();
                        let file = match key {
                            "cert" => &node.cert,
                            "key" => &node.key,
                            "client_ca" => &node.ca,
                            other => panic!("{}: unknown tls_{other}", path.display()),
                        };
                        format!("tls_{key} = {:?}\n", file.display().to_string())
                    }
                    None => format!("{line}\n"),
                })
                .collect();
            assert_eq!(
                uncommented,
                3,
                "{}: tls_cert, tls_key, tls_client_ca",
                path.display()
            );
            let tried = dir.path().join(format!("node{id}.toml"));
            std::fs::write(&tried, text).unwrap();
            let c = crate::daemon::config::ServeArgs {
                config: Some(tried),
                secret_file: Some(secret.clone()),
                ..Default::default()
            }
            .resolve()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(c.tls.is_some_and(|t| t.client_auth()), "{}", path.display());
        }
    }

    /// The unit starts the daemon the way the README says, on the config
    /// path the example files are written for, with unlimited memlock.
    #[test]
    fn the_systemd_unit_runs_serve_with_the_config() {
        let unit = std::fs::read_to_string(deploy().join("systemd/ringraft.service")).unwrap();
        let lines: Vec<&str> = unit.lines().map(str::trim).collect();
        for expected in [
            "ExecStart=/usr/local/bin/ringraft serve --config /etc/ringraft/ringraft.toml",
            "KillSignal=SIGTERM",
            "LimitMEMLOCK=infinity",
            "StateDirectory=ringraft",
        ] {
            assert!(lines.contains(&expected), "the unit lacks {expected}");
        }
    }
}
