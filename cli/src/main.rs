//! `ringraft`: the replicated-log daemon and its command-line client.

mod config;
mod metrics;
mod records;
mod serve;
mod service;

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ringraft_client::{Client, ClientError, Consistency};

#[derive(Parser)]
#[command(
    name = "ringraft",
    version,
    about = "A Raft replicated log whose data plane is one-sided RDMA"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Options every client command takes.
#[derive(clap::Args, Clone, Debug)]
struct Endpoints {
    /// Client API addresses (host:port,...), tried in turn.
    #[arg(long, default_value = "127.0.0.1:7101", value_delimiter = ',')]
    endpoints: Vec<String>,
    /// Time allowed per endpoint per attempt, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
}

impl Endpoints {
    fn client(&self) -> Client {
        Client::new(
            self.endpoints.clone(),
            Duration::from_millis(self.timeout_ms),
        )
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run a node.
    Serve(Box<config::ServeArgs>),
    /// Append records (the arguments, or one per stdin line); prints each
    /// record's index, one per line.
    Append {
        #[command(flatten)]
        endpoints: Endpoints,
        /// Records to append (none: read stdin, one record per line).
        data: Vec<String>,
    },
    /// Read committed records.
    Read {
        #[command(flatten)]
        endpoints: Endpoints,
        /// First index.
        #[arg(long, default_value_t = 1)]
        from: u64,
        /// Last index (default: the last committed).
        #[arg(long)]
        to: Option<u64>,
        /// Keep following new records.
        #[arg(long)]
        follow: bool,
        /// raw (bytes then a newline) or json.
        #[arg(long, default_value = "raw")]
        format: String,
        /// linearizable, lease or stale.
        #[arg(long, default_value = "linearizable")]
        consistency: String,
    },
    /// The view of the node reached.
    Status {
        #[command(flatten)]
        endpoints: Endpoints,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Membership.
    Members {
        #[command(subcommand)]
        action: MembersAction,
    },
    /// Ask the leader to hand leadership to a node.
    Transfer {
        #[command(flatten)]
        endpoints: Endpoints,
        /// The node to lead.
        to: u64,
    },
    /// Offline tools for a node's write-ahead log.
    Wal {
        #[command(subcommand)]
        action: WalAction,
    },
}

#[derive(Subcommand)]
enum MembersAction {
    /// List the members.
    List {
        #[command(flatten)]
        endpoints: Endpoints,
    },
    /// Add a learner: a node that receives the log without voting.
    Add {
        #[command(flatten)]
        endpoints: Endpoints,
        /// Its id.
        id: u64,
        /// Its --listen address.
        addr: String,
    },
    /// Make learners voters.
    Promote {
        #[command(flatten)]
        endpoints: Endpoints,
        /// Their ids.
        ids: Vec<u64>,
    },
    /// Remove members.
    Remove {
        #[command(flatten)]
        endpoints: Endpoints,
        /// Their ids.
        ids: Vec<u64>,
    },
}

#[derive(Subcommand)]
enum WalAction {
    /// Check a stopped node's ring: valid range, first invalid record and
    /// why; exit 1 when corruption lies inside what the node acknowledged.
    Check {
        /// The node's data directory.
        #[arg(long)]
        data_dir: std::path::PathBuf,
    },
}

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,openraft=warn".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("ringraft: {e}");
    ExitCode::from(2)
}

fn client_error(e: ClientError) -> ExitCode {
    fail(e)
}

fn parse_consistency(s: &str) -> Result<Consistency, String> {
    match s {
        "linearizable" => Ok(Consistency::Linearizable),
        "lease" => Ok(Consistency::Lease),
        "stale" => Ok(Consistency::Stale),
        other => Err(format!(
            "--consistency {other}: expected linearizable, lease or stale"
        )),
    }
}

fn print_record(
    out: &mut impl Write,
    r: &ringraft_client::proto::Record,
    json: bool,
) -> std::io::Result<()> {
    if json {
        let data = match std::str::from_utf8(&r.data) {
            Ok(s) => serde_json::Value::String(s.to_string()),
            Err(_) => serde_json::Value::Array(r.data.iter().map(|b| (*b).into()).collect()),
        };
        writeln!(
            out,
            "{}",
            serde_json::json!({"index": r.index, "term": r.term, "data": data})
        )
    } else {
        out.write_all(&r.data)?;
        out.write_all(b"\n")
    }
}

fn print_members(members: &[ringraft_client::proto::Member]) {
    for m in members {
        println!(
            "{} {} {}",
            m.id,
            m.addr,
            if m.voter { "voter" } else { "learner" }
        );
    }
}

async fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Serve(args) => {
            let config = match args.resolve() {
                Ok(c) => c,
                Err(e) => return fail(e),
            };
            init_logging(config.json_logs);
            if config.secret == config::DEV_SECRET {
                tracing::warn!(
                    "no --secret-file: using the built-in development secret; do not do this in production"
                );
            }
            match serve::run(config).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e),
            }
        }
        Command::Append { endpoints, data } => {
            let mut client = endpoints.client();
            let mut out = std::io::stdout().lock();
            if !data.is_empty() {
                let records = data.into_iter().map(String::into_bytes).collect();
                return match client.append(records).await {
                    Ok(indexes) => {
                        for i in indexes {
                            let _ = writeln!(out, "{i}");
                        }
                        ExitCode::SUCCESS
                    }
                    Err(e) => client_error(e),
                };
            }
            // One record per stdin line, in batches of what is available.
            let stdin = std::io::stdin();
            let mut batch = Vec::new();
            for line in stdin.lock().lines() {
                let line = match line {
                    Ok(l) => l,
                    Err(e) => return fail(format!("stdin: {e}")),
                };
                batch.push(line.into_bytes());
                if batch.len() == 256 {
                    match client.append(std::mem::take(&mut batch)).await {
                        Ok(indexes) => indexes.iter().for_each(|i| {
                            let _ = writeln!(out, "{i}");
                        }),
                        Err(e) => return client_error(e),
                    }
                }
            }
            if !batch.is_empty() {
                match client.append(batch).await {
                    Ok(indexes) => indexes.iter().for_each(|i| {
                        let _ = writeln!(out, "{i}");
                    }),
                    Err(e) => return client_error(e),
                }
            }
            ExitCode::SUCCESS
        }
        Command::Read {
            endpoints,
            from,
            to,
            follow,
            format,
            consistency,
        } => {
            let json = match format.as_str() {
                "raw" => false,
                "json" => true,
                other => return fail(format!("--format {other}: expected raw or json")),
            };
            let consistency = match parse_consistency(&consistency) {
                Ok(c) => c,
                Err(e) => return fail(e),
            };
            let mut client = endpoints.client();
            let mut out = std::io::stdout().lock();
            if !follow {
                return match client.read(from, to.unwrap_or(0), consistency).await {
                    Ok(records) => {
                        for r in &records {
                            if print_record(&mut out, r, json).is_err() {
                                return ExitCode::SUCCESS;
                            }
                        }
                        ExitCode::SUCCESS
                    }
                    Err(e) => client_error(e),
                };
            }
            let mut next = from;
            loop {
                let mut stream = match client.follow(next).await {
                    Ok(s) => s,
                    Err(e) => return client_error(e),
                };
                while let Ok(Some(r)) = stream.message().await {
                    if to.is_some_and(|t| r.index > t) {
                        return ExitCode::SUCCESS;
                    }
                    next = r.index + 1;
                    if print_record(&mut out, &r, json).is_err() || out.flush().is_err() {
                        return ExitCode::SUCCESS;
                    }
                }
                // The node went away: follow from another one.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Command::Status { endpoints, json } => match endpoints.client().status().await {
            Ok(s) => {
                if json {
                    let members: Vec<_> = s
                        .members
                        .iter()
                        .map(|m| serde_json::json!({"id": m.id, "addr": m.addr, "voter": m.voter}))
                        .collect();
                    println!(
                        "{}",
                        serde_json::json!({
                            "id": s.id,
                            "state": s.state,
                            "leader_id": if s.leader_id == 0 { serde_json::Value::Null } else { s.leader_id.into() },
                            "leader_addr": s.leader_addr,
                            "term": s.term,
                            "commit_index": s.commit_index,
                            "applied_index": s.applied_index,
                            "last_log_index": s.last_log_index,
                            "members": members,
                            "fabric": s.fabric,
                            "durability": s.durability,
                            "votes_blocked": s.votes_blocked,
                        })
                    );
                } else {
                    println!("node {} ({}), term {}", s.id, s.state, s.term);
                    println!(
                        "leader {}",
                        if s.leader_id == 0 {
                            "unknown".into()
                        } else {
                            format!("{} at {}", s.leader_id, s.leader_addr)
                        }
                    );
                    println!(
                        "commit {}, applied {}, last log {}",
                        s.commit_index, s.applied_index, s.last_log_index
                    );
                    println!(
                        "fabric {}, durability {}{}",
                        s.fabric,
                        s.durability,
                        if s.votes_blocked {
                            ", votes blocked (log corrupt inside)"
                        } else {
                            ""
                        }
                    );
                    print_members(&s.members);
                }
                ExitCode::SUCCESS
            }
            Err(e) => client_error(e),
        },
        Command::Members { action } => {
            let result = match action {
                MembersAction::List { endpoints } => endpoints.client().members().await,
                MembersAction::Add {
                    endpoints,
                    id,
                    addr,
                } => endpoints.client().add_learner(id, addr).await,
                MembersAction::Promote { endpoints, ids } => endpoints.client().promote(ids).await,
                MembersAction::Remove { endpoints, ids } => endpoints.client().remove(ids).await,
            };
            match result {
                Ok(members) => {
                    print_members(&members);
                    ExitCode::SUCCESS
                }
                Err(e) => client_error(e),
            }
        }
        Command::Transfer { endpoints, to } => match endpoints.client().transfer_leader(to).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => client_error(e),
        },
        Command::Wal {
            action: WalAction::Check { data_dir },
        } => match ringraft_wal::check(&data_dir) {
            Ok(report) => {
                println!("{report}");
                if report.corrupt_in_acknowledged_range() {
                    ExitCode::from(1)
                } else {
                    ExitCode::SUCCESS
                }
            }
            Err(e) => fail(format!("wal check {}: {e}", data_dir.display())),
        },
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(format!("tokio runtime: {e}")),
    };
    runtime.block_on(run(cli))
}
