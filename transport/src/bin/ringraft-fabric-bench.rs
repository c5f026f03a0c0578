//! Fabric benchmark: WRITE latency (8 B, 64 B, 4 KiB) and 64 KiB WRITE
//! bandwidth of one backend, side A and side B in this process (for rdma:
//! two queue pairs on the same device, as perftest's loopback runs).
//!
//! ```text
//! ringraft-fabric-bench --backend tcp
//! ringraft-fabric-bench --backend inproc
//! ringraft-fabric-bench --backend rdma --device rxe0 --listen 10.0.0.1:0 [--busy-poll]
//! ```
//! Prints a table and, with `--json`, one JSON object per measurement.

use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use ringraft_transport::conformance::suite_secret;
use ringraft_transport::inproc::Fabric;
use ringraft_transport::{
    Access, Backend, ConnConfig, Connection, Device, DeviceConfig, DeviceLimits, reveal_to_all,
};

#[derive(Parser)]
#[command(about = "ringraft fabric benchmark")]
struct Args {
    /// rdma, tcp or inproc.
    #[arg(long, default_value = "tcp")]
    backend: String,
    /// RDMA device name.
    #[arg(long)]
    device: Option<String>,
    /// Where side B listens (tcp/rdma).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Sequential WRITEs per latency measurement.
    #[arg(long, default_value_t = 2000)]
    iterations: u32,
    /// 64 KiB WRITEs in the bandwidth measurement.
    #[arg(long, default_value_t = 2000)]
    bw_writes: u32,
    /// WRITEs in flight in the bandwidth measurement.
    #[arg(long, default_value_t = 16)]
    depth: usize,
    /// Busy-poll completions (rdma).
    #[arg(long)]
    busy_poll: bool,
    /// Also print JSON lines.
    #[arg(long)]
    json: bool,
}

fn config(node_id: u64) -> DeviceConfig {
    DeviceConfig {
        node_id,
        secret: suite_secret(),
        limits: DeviceLimits::default(),
    }
}

async fn devices(args: &Args) -> Result<(Device, Device, String), String> {
    match args.backend.as_str() {
        "inproc" => {
            let fabric = Fabric::new(1);
            Ok((
                fabric.device("a", config(1)),
                fabric.device("b", config(2)),
                "b:bench".into(),
            ))
        }
        "tcp" => Ok((
            Device::tcp(config(1)),
            Device::tcp(config(2)),
            args.listen.clone(),
        )),
        "rdma" => {
            let a = Device::open(Backend::Rdma, args.device.as_deref(), config(1))
                .map_err(|e| e.to_string())?;
            let b = Device::open(Backend::Rdma, args.device.as_deref(), config(2))
                .map_err(|e| e.to_string())?;
            Ok((a, b, args.listen.clone()))
        }
        other => Err(format!("unknown backend {other}")),
    }
}

fn emit(args: &Args, what: &str, fields: &[(&str, f64)]) {
    let text: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v:.2}")).collect();
    println!("{:<8} {:<22} {}", args.backend, what, text.join(" "));
    if args.json {
        let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
        println!(
            "{{\"backend\":\"{}\",\"busy_poll\":{},\"measure\":\"{}\",{}}}",
            args.backend,
            args.busy_poll,
            what,
            body.join(",")
        );
    }
}

async fn latency(
    args: &Args,
    conn: &Connection,
    remote: ringraft_transport::RemoteRegion,
    size: usize,
) -> Result<(), String> {
    let data = vec![0xA5u8; size];
    let mut hist = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    // Warm-up.
    for _ in 0..(args.iterations / 10).max(10) {
        conn.write(remote.start(), &data)
            .await
            .map_err(|e| e.to_string())?;
    }
    for _ in 0..args.iterations {
        let start = Instant::now();
        conn.write(remote.start(), &data)
            .await
            .map_err(|e| e.to_string())?;
        hist.record(start.elapsed().as_nanos() as u64)
            .map_err(|e| e.to_string())?;
    }
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    emit(
        args,
        &format!("write_lat_{size}B"),
        &[
            ("p50_us", us(0.5)),
            ("p99_us", us(0.99)),
            ("min_us", hist.min() as f64 / 1000.0),
            ("mean_us", hist.mean() / 1000.0),
            ("iterations", args.iterations as f64),
        ],
    );
    Ok(())
}

async fn bandwidth(
    args: &Args,
    conn: &Connection,
    remote: ringraft_transport::RemoteRegion,
) -> Result<(), String> {
    let size = 64usize << 10;
    let data = vec![0x5Au8; size];
    let slots = (remote.len as usize / size).max(1);
    let start = Instant::now();
    let mut in_flight = std::collections::VecDeque::new();
    for k in 0..args.bw_writes as usize {
        if in_flight.len() >= args.depth {
            let p: ringraft_transport::Completion<()> = in_flight.pop_front().expect("non-empty");
            p.await.map_err(|e| e.to_string())?;
        }
        let at = remote
            .at(((k % slots) * size) as u64, size as u64)
            .ok_or("address")?;
        in_flight.push_back(conn.post_write(at, &data).map_err(|e| e.to_string())?);
    }
    for p in in_flight {
        p.await.map_err(|e| e.to_string())?;
    }
    let secs = start.elapsed().as_secs_f64();
    let mb = args.bw_writes as f64 * size as f64 / 1e6;
    emit(
        args,
        "write_bw_64KiB",
        &[
            ("MB_per_s", mb / secs),
            ("writes", args.bw_writes as f64),
            ("depth", args.depth as f64),
        ],
    );
    Ok(())
}

async fn run(args: Args) -> Result<(), String> {
    let (a, b, listen) = devices(&args).await?;
    let conn_config = ConnConfig {
        busy_poll: args.busy_poll,
        max_outstanding: (args.depth as u32).max(16) * 2,
        ..ConnConfig::default()
    };
    let mut listener = b
        .listen(&listen, conn_config.clone(), reveal_to_all(vec![]))
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr();
    let conn = a
        .connect(&addr, conn_config, vec![])
        .await
        .map_err(|e| e.to_string())?;
    let _server_side = listener.accept().await.ok_or("listener closed")?;
    emit(
        &args,
        "inline",
        &[("max_inline_bytes", f64::from(conn.max_inline_bytes()))],
    );
    let region = b
        .register_buffer(4 << 20, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .map_err(|e| e.to_string())?;
    for size in [8usize, 64, 4096] {
        latency(&args, &conn, region.remote(), size).await?;
    }
    bandwidth(&args, &conn, region.remote()).await?;
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(())
}

#[tokio::main]
async fn main() {
    ringraft_transport::init_tool_logging();
    if let Err(e) = run(Args::parse()).await {
        eprintln!("fabric bench: {e}");
        std::process::exit(1);
    }
}
