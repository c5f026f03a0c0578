//! The `tcp` backend: the software RNIC's frames over a TCP stream.
//!
//! After the handshake the stream carries length-prefixed frames (u32 LE
//! length, then bincode of a frame, at most the connection's
//! [`ConnConfig::max_frame_bytes`]: its largest transfer or message plus
//! headers). A frame's buffer grows with the bytes that arrive, not with
//! the length a peer declares. A reader task decodes
//! frames through a buffer and hands each to the queue pair's `Inbound`
//! itself (which executes most requests there and then); a writer task
//! encodes the queue pair's outgoing frames into one buffer, so that what
//! is queued together leaves in one write. A malformed frame, a frame
//! above the limit, or a socket error moves the queue pair to the error
//! state; it never takes the process down.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::api::AcceptPolicy;
use crate::bootstrap;
use crate::error::Result;
use crate::gate::Gate;
use crate::handshake;
use crate::limits::ConnSlot;
use crate::soft::conn::{Frame, Inbound, Incoming, MAX_FRAME_BYTES, WireOut, wire_read_by};
use crate::soft::{SoftConnection, SoftDevice};
use crate::types::ConnConfig;

/// The reader's buffer.
const READ_BUFFER_BYTES: usize = 64 << 10;
/// The writer writes once its buffer holds this much, even with more
/// frames queued.
const WRITE_BUFFER_BYTES: usize = 64 << 10;

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

    fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }

    fn local(&self) -> handshake::Local<'_> {
        self.handshake_side()
    }

    async fn accept_one(
        &self,
        mut stream: TcpStream,
        peer: &str,
        accepted: handshake::Accepted,
        config: &ConnConfig,
        policy: &AcceptPolicy,
    ) -> Result<SoftConnection> {
        let (info, endpoint, slot) = self
            .admit_and_answer(&mut stream, peer, accepted, config, policy)
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
    // The server proved the secret: its address is a member's, let in
    // past the cap on strangers when it connects to us.
    if let Ok(server) = stream.peer_addr() {
        device.gate.learn(server.ip());
    }
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
    let (read_half, write_half) = stream.into_split();
    let peer = addr.clone();
    let max_frame_bytes = config.max_frame_bytes();
    let (wire, out) = wire_read_by(Incoming::Reader(Box::new(move |inbound| {
        tokio::spawn(read_frames(read_half, inbound, peer, max_frame_bytes));
    })));
    tokio::spawn(write_frames(write_half, out));
    device.start(addr, config, info, endpoint, wire, slot)
}

async fn read_frames(
    stream: tokio::net::tcp::OwnedReadHalf,
    mut inbound: Inbound,
    peer: String,
    max_frame_bytes: usize,
) {
    // Buffered: a frame's length and body, and the small frames queued
    // behind it, come in one read(2) instead of two per frame.
    let mut stream = BufReader::with_capacity(READ_BUFFER_BYTES, stream);
    let reason = loop {
        if !holds_a_frame(stream.buffer()) {
            // About to wait for the socket: what is held back is told now.
            inbound.idle();
        }
        let mut len = [0u8; 4];
        if let Err(e) = stream.read_exact(&mut len).await {
            break format!("read from {peer}: {e}");
        }
        let len = u32::from_le_bytes(len) as usize;
        if len > max_frame_bytes {
            tracing::warn!(%peer, len, max_frame_bytes, "frame above the limit: closing the connection");
            break format!(
                "frame of {len} bytes from {peer} is above the limit of {max_frame_bytes}"
            );
        }
        let body = match read_body(&mut stream, len).await {
            Ok(body) => body,
            Err(e) => break format!("read from {peer}: {e}"),
        };
        match decode_frame(&body) {
            Ok((frame, used)) if used == len => {
                if !inbound.frame(frame) {
                    return;
                }
            }
            Ok(_) => {
                tracing::warn!(%peer, "trailing bytes in a frame: closing the connection");
                break format!("trailing bytes in a frame from {peer}");
            }
            Err(e) => {
                tracing::warn!(%peer, error = %e, "malformed frame: closing the connection");
                break format!("malformed frame from {peer}: {e}");
            }
        }
    };
    inbound.ended(reason);
}

/// A frame's body of `len` bytes: at once when the buffer holds it, else
/// in a buffer that grows as the bytes arrive (a peer that declares a
/// large frame and sends nothing costs nothing).
async fn read_body<R: tokio::io::AsyncBufRead + Unpin>(
    stream: &mut R,
    len: usize,
) -> std::io::Result<Vec<u8>> {
    if len <= stream.fill_buf().await?.len() {
        let mut body = vec![0u8; len];
        stream.read_exact(&mut body).await?;
        return Ok(body);
    }
    let mut body = Vec::with_capacity(len.min(READ_BUFFER_BYTES));
    (&mut *stream)
        .take(len as u64)
        .read_to_end(&mut body)
        .await?;
    if body.len() < len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(body)
}

/// Decodes a frame's body; a length inside it claims at most what the body
/// can hold ([`crate::bounded`]).
pub(crate) fn decode_frame(body: &[u8]) -> Result<(Frame, usize), bincode::error::DecodeError> {
    crate::bounded::decode(body, MAX_FRAME_BYTES)
}

/// Whether `buffered` starts with a whole frame (length and body).
fn holds_a_frame(buffered: &[u8]) -> bool {
    match buffered.first_chunk::<4>() {
        Some(len) => buffered.len() - 4 >= u32::from_le_bytes(*len) as usize,
        None => false,
    }
}

async fn write_frames(mut stream: tokio::net::tcp::OwnedWriteHalf, mut out: WireOut) {
    // Frames queued together are encoded into one buffer and leave in one
    // write(2).
    let mut buffer = Vec::with_capacity(WRITE_BUFFER_BYTES);
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
            if let Err(error) = encode_frame(&frame, &mut buffer) {
                tracing::error!(%error, "frame does not encode");
                return;
            }
            if buffer.len() >= WRITE_BUFFER_BYTES {
                break;
            }
            // Batch whatever is already queued into the same write.
            match out
                .responses
                .try_recv()
                .or_else(|_| out.requests.try_recv())
            {
                Ok(next) if !closing => frame = next,
                _ => break,
            }
        }
        if stream.write_all(&buffer).await.is_err() {
            return;
        }
        buffer.clear();
        buffer.shrink_to(WRITE_BUFFER_BYTES);
    }
    let _ = stream.shutdown().await;
}

/// Appends `frame`, with its length in front, to `buffer`.
fn encode_frame(frame: &Frame, buffer: &mut Vec<u8>) -> Result<(), bincode::error::EncodeError> {
    let start = buffer.len();
    buffer.extend_from_slice(&[0; 4]);
    bincode::serde::encode_into_std_write(frame, buffer, codec())?;
    let len = (buffer.len() - start - 4) as u32;
    buffer[start..start + 4].copy_from_slice(&len.to_le_bytes());
    Ok(())
}
