//! Runs the transport conformance suite against one backend.
//!
//! ```text
//! ringraft-conformance --backend tcp local
//! ringraft-conformance --backend rdma --device rxe0 local --listen 10.0.0.1:0
//! ringraft-conformance --backend rdma serve --control 0.0.0.0:7470 --advertise 10.77.0.11   # side B
//! ringraft-conformance --backend rdma remote --control 10.77.0.11:7470                      # side A
//! ```
//! Exit status 0 when every check passed.

use clap::{Parser, Subcommand};
use ringraft_transport::conformance::{self, LocalPeer, RemotePeer, suite_secret, wrong_secret};
use ringraft_transport::{Backend, Device, DeviceConfig, DeviceLimits, Secret};

#[derive(Parser)]
#[command(about = "ringraft transport conformance suite")]
struct Args {
    /// rdma or tcp.
    #[arg(long, default_value = "tcp", value_parser = parse_backend)]
    backend: Backend,
    /// RDMA device name (first active one by default).
    #[arg(long)]
    device: Option<String>,
    /// Run only the checks whose name contains this.
    #[arg(long, default_value = "")]
    filter: String,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Both sides in this process.
    Local {
        /// Where side B listens.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
    },
    /// Serve side B for a `remote` run.
    Serve {
        /// Control listener address.
        #[arg(long)]
        control: String,
        /// Data listeners' bind address.
        #[arg(long, default_value = "0.0.0.0:0")]
        data: String,
        /// Host clients should connect to for data connections.
        #[arg(long)]
        advertise: Option<String>,
    },
    /// Side A against a `serve` elsewhere.
    Remote {
        /// The server's control address.
        #[arg(long)]
        control: String,
        /// Seconds to keep retrying the control connection.
        #[arg(long, default_value_t = 60)]
        wait: u64,
    },
}

fn parse_backend(s: &str) -> Result<Backend, String> {
    match s {
        "rdma" => Ok(Backend::Rdma),
        "tcp" => Ok(Backend::Tcp),
        other => Err(format!("unknown backend {other} (rdma or tcp)")),
    }
}

fn open(args: &Args, node_id: u64, secret: Secret) -> Device {
    let config = DeviceConfig {
        node_id,
        secret,
        limits: DeviceLimits::default(),
    };
    match Device::open(args.backend, args.device.as_deref(), config) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cannot open the {} device: {e}", args.backend);
            std::process::exit(2);
        }
    }
}

fn report(results: &[(&'static str, conformance::CheckResult)], backend: Backend) -> i32 {
    let mut failed = 0;
    for (name, outcome) in results {
        match outcome {
            Ok(()) => println!("{backend}: {name} ... ok"),
            Err(e) => {
                failed += 1;
                println!("{backend}: {name} ... FAILED: {e}");
            }
        }
    }
    println!(
        "{backend}: {} passed, {failed} failed",
        results.len() - failed
    );
    if failed > 0 || results.is_empty() {
        1
    } else {
        0
    }
}

#[tokio::main]
async fn main() {
    ringraft_transport::init_tool_logging();
    let args = Args::parse();
    let code = match &args.mode {
        Mode::Local { listen } => {
            let a = open(&args, 1, suite_secret());
            let outsider = open(&args, 9, wrong_secret());
            let mut b = LocalPeer::new(open(&args, 2, suite_secret()), listen);
            let results = conformance::run(&a, &outsider, &mut b, &args.filter).await;
            report(&results, args.backend)
        }
        Mode::Serve {
            control,
            data,
            advertise,
        } => {
            let b = open(&args, 2, suite_secret());
            match conformance::serve(b, control, data, advertise.as_deref()).await {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("serve: {e}");
                    1
                }
            }
        }
        Mode::Remote { control, wait } => {
            let a = open(&args, 1, suite_secret());
            let outsider = open(&args, 9, wrong_secret());
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(*wait);
            let mut peer = loop {
                match RemotePeer::connect(&a, control).await {
                    Ok(p) => break p,
                    Err(e) if std::time::Instant::now() > deadline => {
                        eprintln!("{e}");
                        std::process::exit(1);
                    }
                    Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
                }
            };
            let results = conformance::run(&a, &outsider, &mut peer, &args.filter).await;
            let _ = peer.finish().await;
            report(&results, args.backend)
        }
    };
    std::process::exit(code);
}
