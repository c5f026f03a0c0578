//! The `tcp` backend: the software RNIC's frames over a TCP stream.
//!
//! After the handshake the stream carries length-prefixed frames (u32 LE
//! length, then bincode of a frame, at most ~1 GiB). A reader task decodes
//! frames into the queue pair through a buffer; a writer task drains the queue pair's
//! outgoing frames, batching them into one flush. A malformed frame, a
//! frame above the limit, or a socket error moves the queue pair to the
//! error state; it never takes the process down.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::api::AcceptPolicy;
use crate::bootstrap;
use crate::error::Result;
use crate::limits::ConnSlot;
use crate::soft::conn::{Frame, MAX_FRAME_BYTES, WireOut, wire};
use crate::soft::{SoftConnection, SoftDevice};
use crate::types::ConnConfig;

/// The reader's buffer (the writer's is the same size).
const READ_BUFFER_BYTES: usize = 64 << 10;

fn codec() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_FRAME_BYTES>()
}

/// The tcp backend's side of a bootstrap stream: after the handshake, the
/// stream carries the frames.
impl bootstrap::Accept for SoftDevice {
    type Connection = SoftConnection;
    const REJECTED_WHAT: &'static str = "connection attempt rejected";

    fn rejected(&self) -> &Arc<AtomicU64> {
        &self.rejected
    }

    async fn accept_one(
        &self,
        mut stream: TcpStream,
        peer: &str,
        config: &ConnConfig,
        policy: &AcceptPolicy,
    ) -> Result<SoftConnection> {
        let (info, endpoint, slot) = self
            .server_handshake(&mut stream, peer, config, policy)
            .await?;
        Ok(start(
            self,
            stream,
            peer.to_string(),
            config.clone(),
            info,
            endpoint,
            slot,
        ))
    }
}

pub(crate) async fn connect(
    device: Arc<SoftDevice>,
    addr: &str,
    config: ConnConfig,
    app_data: Vec<u8>,
) -> Result<SoftConnection> {
    let slot = device.reserve_connection()?;
    let mut stream = bootstrap::dial(addr, config.handshake_timeout).await?;
    let (info, endpoint) = device
        .client_handshake(&mut stream, addr, &config, app_data)
        .await?;
    Ok(start(
        &device,
        stream,
        addr.to_string(),
        config,
        info,
        endpoint,
        slot,
    ))
}

fn start(
    device: &SoftDevice,
    stream: TcpStream,
    addr: String,
    config: ConnConfig,
    info: crate::handshake::PeerInfo,
    endpoint: crate::soft::conn::SoftEndpoint,
    slot: ConnSlot,
) -> SoftConnection {
    let (wire, out, incoming) = wire();
    let (read_half, write_half) = stream.into_split();
    tokio::spawn(read_frames(read_half, incoming, addr.clone()));
    tokio::spawn(write_frames(write_half, out));
    device.start(addr, config, info, endpoint, wire, slot)
}

async fn read_frames(
    stream: tokio::net::tcp::OwnedReadHalf,
    incoming: mpsc::UnboundedSender<Frame>,
    peer: String,
) {
    // Buffered: a frame's length and body, and the small frames queued
    // behind it, come in one read(2) instead of two per frame.
    let mut stream = BufReader::with_capacity(READ_BUFFER_BYTES, stream);
    let reason = loop {
        let mut len = [0u8; 4];
        if let Err(e) = stream.read_exact(&mut len).await {
            break format!("read from {peer}: {e}");
        }
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_FRAME_BYTES {
            break format!("frame of {len} bytes from {peer} is above the limit");
        }
        let mut body = vec![0u8; len];
        if let Err(e) = stream.read_exact(&mut body).await {
            break format!("read from {peer}: {e}");
        }
        match bincode::serde::decode_from_slice::<Frame, _>(&body, codec()) {
            Ok((frame, used)) if used == len => {
                if incoming.send(frame).is_err() {
                    return;
                }
            }
            Ok(_) => break format!("trailing bytes in a frame from {peer}"),
            Err(e) => break format!("malformed frame from {peer}: {e}"),
        }
    };
    let _ = incoming.send(Frame::Close { reason });
}

async fn write_frames(stream: tokio::net::tcp::OwnedWriteHalf, mut out: WireOut) {
    let mut stream = BufWriter::with_capacity(64 << 10, stream);
    let mut closing = false;
    while !closing {
        // Answers first: a Close queued after an answer must not overtake it.
        let frame = tokio::select! {
            biased;
            f = out.responses.recv() => f,
            f = out.requests.recv() => f,
        };
        let Some(mut frame) = frame else { break };
        loop {
            closing |= matches!(frame, Frame::Close { .. });
            let body = match bincode::serde::encode_to_vec(&frame, codec()) {
                Ok(b) => b,
                Err(error) => {
                    tracing::error!(%error, "frame does not encode");
                    return;
                }
            };
            let len = (body.len() as u32).to_le_bytes();
            if stream.write_all(&len).await.is_err() || stream.write_all(&body).await.is_err() {
                return;
            }
            // Batch whatever is already queued into the same flush.
            match out
                .responses
                .try_recv()
                .or_else(|_| out.requests.try_recv())
            {
                Ok(next) if !closing => frame = next,
                _ => break,
            }
        }
        if stream.flush().await.is_err() {
            return;
        }
    }
    let _ = stream.shutdown().await;
}
