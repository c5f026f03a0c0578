//! Ways into the crate's decoders of outside input that the crate keeps to
//! itself, for the fuzz targets (`fuzz/` at the top of the repository) and
//! the property tests (`tests/decode_props.rs`). Not part of the API: hidden
//! from the docs, no stability promised.
//!
//! Owns thin wrappers and the handshake driver of the fuzz target, nothing
//! else: no decoder lives here, and the crate itself never calls into this
//! module.
//!
//! - [`WireFrame`]: a frame of the software RNIC as the `tcp` backend puts
//!   it on the wire after the handshake (its codec and rules, those of
//!   `tcp.rs`'s reader: bincode within [`MAX_WIRE_FRAME_BYTES`], no
//!   trailing bytes); [`read_frame_stream`] splits a byte stream the way
//!   the reader does.
//! - [`decode_soft_endpoint`]: the endpoint description a software queue
//!   pair's peer reveals in the handshake.
//! - [`run_handshake`]: one side of the bootstrap handshake
//!   ([`crate::handshake`]) against bytes from the input, over an in-memory
//!   stream, optionally behind a real counterpart that proves the secret.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, DuplexStream};

use crate::error::{Result, WcError};
use crate::handshake::{self, Local, Reveal, Secret};
use crate::soft::conn::{Frame, MAX_FRAME_BYTES, SoftEndpoint};
use crate::types::{Backend, ConnConfig};
use crate::work::{Done, Request};

/// Largest frame body the `tcp` backend reads (bytes, after the u32 LE
/// length).
pub const MAX_WIRE_FRAME_BYTES: usize = MAX_FRAME_BYTES;

/// The `tcp` backend's frame codec (`tcp.rs`, `codec`).
fn frame_codec() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_FRAME_BYTES>()
}

/// One frame of the software RNIC's wire, opaque.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireFrame(Frame);

impl WireFrame {
    /// Decodes a frame body as the `tcp` backend's reader does: an error
    /// for anything malformed, above the limit, or followed by trailing
    /// bytes.
    ///
    /// # Errors
    ///
    /// The reader's reason for ending the connection.
    pub fn decode(body: &[u8]) -> std::result::Result<WireFrame, String> {
        match crate::tcp::decode_frame(body) {
            Ok((frame, used)) if used == body.len() => Ok(WireFrame(frame)),
            Ok(_) => Err("trailing bytes in a frame".to_string()),
            Err(e) => Err(format!("malformed frame: {e}")),
        }
    }

    /// The frame's body, as the `tcp` backend's writer encodes it.
    ///
    /// # Panics
    ///
    /// If the frame is above the codec's limit (a decoded frame never is).
    pub fn encode(&self) -> Vec<u8> {
        bincode::serde::encode_to_vec(&self.0, frame_codec()).expect("a frame within the limit")
    }

    /// Appends the frame with its u32 LE length in front, as on the wire.
    pub fn encode_framed(&self, out: &mut Vec<u8>) {
        let body = self.encode();
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
    }

    /// Whether the frame answers requests (a response or an
    /// acknowledgement).
    pub fn is_answer(&self) -> bool {
        self.0.is_answer()
    }
}

/// A frame of each kind the wire carries, made of the given values:
/// requests (WRITE with and without immediate, READ, compare-and-swap,
/// fetch-and-add, SEND), answers (done, data, word, each error) and the
/// control frames (acknowledgement, close).
pub fn example_frames(addr: u64, rkey: u32, word: u64, data: &[u8]) -> Vec<WireFrame> {
    let seq = word.wrapping_mul(31);
    let requests = [
        Request::Write {
            addr,
            rkey,
            data: data.to_vec(),
            imm: None,
        },
        Request::Write {
            addr,
            rkey,
            data: data.to_vec(),
            imm: Some(rkey ^ 0x5a5a),
        },
        Request::Read {
            addr,
            rkey,
            len: data.len() as u32,
        },
        Request::CompareSwap {
            addr,
            rkey,
            expected: word,
            new: word.wrapping_add(1),
        },
        Request::FetchAdd {
            addr,
            rkey,
            add: word,
        },
        Request::Send {
            data: data.to_vec(),
        },
    ];
    let results = [
        Ok(Done::Ok),
        Ok(Done::Data(data.to_vec())),
        Ok(Done::Word(word)),
        Err(WcError::RemoteAccess),
        Err(WcError::RemoteInvalidRequest),
        Err(WcError::RnrRetryExceeded),
        Err(WcError::RetryExceeded),
        Err(WcError::Flushed),
        Err(WcError::LocalError),
        Err(WcError::Other(rkey)),
    ];
    let mut frames: Vec<WireFrame> = requests
        .into_iter()
        .map(|req| WireFrame(Frame::Req { seq, req }))
        .collect();
    frames.extend(
        results
            .into_iter()
            .map(|result| WireFrame(Frame::Resp { seq, result })),
    );
    frames.push(WireFrame(Frame::Ack { upto: seq }));
    frames.push(WireFrame(Frame::Close {
        reason: String::from_utf8_lossy(data).into_owned(),
    }));
    frames
}

/// Splits `stream`, what a peer sent after the handshake, into frames the
/// way the `tcp` backend's reader does (u32 LE length, at most
/// [`MAX_WIRE_FRAME_BYTES`], then the body, decoded by
/// [`WireFrame::decode`]): the frames before the reader stops, and why it
/// stops (the end of the stream included).
pub fn read_frame_stream(stream: &[u8]) -> (Vec<WireFrame>, String) {
    let mut frames = Vec::new();
    let mut rest = stream;
    let reason = loop {
        let Some((len, after)) = rest.split_first_chunk::<4>() else {
            break "end of stream".to_string();
        };
        let len = u32::from_le_bytes(*len) as usize;
        if len > MAX_FRAME_BYTES {
            break format!("frame of {len} bytes is above the limit");
        }
        if after.len() < len {
            break "end of stream inside a frame".to_string();
        }
        let (body, after) = after.split_at(len);
        match WireFrame::decode(body) {
            Ok(frame) => frames.push(frame),
            Err(reason) => break reason,
        }
        rest = after;
    };
    (frames, reason)
}

/// The bytes a software queue pair of `config` reveals as its endpoint.
pub fn soft_endpoint(config: &ConnConfig) -> Vec<u8> {
    SoftEndpoint::of(config).encode()
}

/// Decodes and checks a software queue pair's endpoint description as a
/// device does with what a peer revealed; yields the accepted description
/// encoded again.
///
/// # Errors
///
/// What the device refuses the peer with.
pub fn decode_soft_endpoint(bytes: &[u8]) -> Result<Vec<u8>> {
    SoftEndpoint::decode(bytes, "fuzz").map(|endpoint| endpoint.encode())
}

/// The cluster secret of [`run_handshake`]'s two sides.
pub const HANDSHAKE_SECRET: &[u8] = b"ringraft fuzzing secret, 32 byte";
/// The node id of the side under test in [`run_handshake`].
pub const UNDER_TEST_NODE_ID: u64 = 4;
/// The node id of the real counterpart in [`run_handshake`].
pub const COUNTERPART_NODE_ID: u64 = 9;
/// What the side under test reveals once the peer proved the secret:
/// bytes that must never reach a peer that did not.
pub const UNDER_TEST_REVEAL: &[u8] = b"REVEALED-ONLY-AFTER-AUTHENTICATION";
/// Input flag of [`run_handshake`]: test the client side (else the server).
pub const HANDSHAKE_CLIENT: u8 = 1;
/// Input flag of [`run_handshake`]: a real counterpart proves the secret
/// first; the input's bytes follow its proven messages.
pub const HANDSHAKE_PROVEN: u8 = 2;
/// Bytes each direction of the in-memory streams buffers.
const PIPE_BYTES: usize = 1 << 20;

/// What one run of [`run_handshake`] showed.
#[derive(Debug)]
pub struct HandshakeRun {
    /// The client side was under test (else the server).
    pub client_side: bool,
    /// A real counterpart proved the secret before the input's bytes.
    pub proven: bool,
    /// The side under test authenticated the peer: the peer's node id and
    /// what it revealed (the server: before `Accepted::answer`).
    pub accepted: Option<(u64, Reveal)>,
    /// The error the side under test ended with, if any.
    pub error: Option<String>,
    /// The client under test called its `reveal` closure (it sends what
    /// that returns).
    pub revealed: bool,
    /// Everything the side under test wrote to the input's side of the
    /// stream (for the client: its hello, then what follows it).
    pub wrote: Vec<u8>,
}

/// Runs one side of the handshake (`input[0]` & [`HANDSHAKE_CLIENT`]:
/// the client, else the server) against `input[1..]`, sent by the peer.
/// With [`HANDSHAKE_PROVEN`] set, a real counterpart (the other side of
/// the handshake, with the same secret) proves the secret first, relayed
/// frame by frame, and the input's bytes take the place of its messages
/// after that: the server under test then reads them as the client's
/// endpoint message, the client under test as the server's answer. The
/// side under test reveals [`UNDER_TEST_REVEAL`] (the server in
/// `Accepted::answer`, once it accepted). Without the flag the input's
/// bytes are all the peer sends. The peer's side of the stream is then
/// closed, so that the run ends without a timeout.
///
/// Run it on a tokio runtime with time (paused time keeps the handshake's
/// timeouts from firing on a slow machine).
pub async fn run_handshake(input: &[u8]) -> HandshakeRun {
    let (flags, bytes) = input.split_first().unwrap_or((&0, &[]));
    let client_side = flags & HANDSHAKE_CLIENT != 0;
    let proven = flags & HANDSHAKE_PROVEN != 0;
    let secret = Secret::new(HANDSHAKE_SECRET).expect("a long enough secret");
    let run = HandshakeRun {
        client_side,
        proven,
        accepted: None,
        error: None,
        revealed: false,
        wrote: Vec::new(),
    };
    if client_side {
        client_under_test(&secret, proven, bytes, run).await
    } else {
        server_under_test(&secret, proven, bytes, run).await
    }
}

/// The real counterpart's end: a fixed nonce (what it proves is made
/// fresh by the other side's nonce).
fn local(secret: &Secret, node_id: u64) -> Local<'_> {
    Local {
        secret,
        backend: Backend::Tcp,
        node_id,
        nonce: [node_id as u8; 32],
    }
}

/// The end under test: a fresh nonce from the OS, as every real device
/// draws, so that no recorded proof (a seed's) is valid again.
fn local_under_test(secret: &Secret) -> Local<'_> {
    Local {
        nonce: handshake::fresh_nonce(),
        ..local(secret, UNDER_TEST_NODE_ID)
    }
}

const TIMEOUT: Duration = Duration::from_secs(5);

/// Reads one frame (length and body) as sent, `None` at the end.
async fn relay_frame<S: AsyncRead + Unpin>(from: &mut S) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    from.read_exact(&mut len).await.ok()?;
    let body_len = u32::from_le_bytes(len);
    if body_len > handshake::MAX_FRAME_BYTES {
        return None;
    }
    let mut frame = len.to_vec();
    frame.resize(4 + body_len as usize, 0);
    from.read_exact(&mut frame[4..]).await.ok()?;
    Some(frame)
}

/// Writes `bytes`, closes the write side, and reads everything until the
/// other end closes.
async fn send_close_and_drain(peer: &mut DuplexStream, bytes: &[u8], wrote: &mut Vec<u8>) {
    // The side under test may stop reading and go away: what it does not
    // read is lost, as on a socket.
    let _ = peer.write_all(bytes).await;
    let _ = peer.shutdown().await;
    let _ = peer.read_to_end(wrote).await;
}

async fn server_under_test(
    secret: &Secret,
    proven: bool,
    bytes: &[u8],
    mut run: HandshakeRun,
) -> HandshakeRun {
    let (mut server_io, mut peer) = tokio::io::duplex(PIPE_BYTES);
    let server = async move {
        let result = handshake::server(
            &mut server_io,
            "fuzz-client",
            local_under_test(secret),
            TIMEOUT,
        )
        .await;
        if let Ok(accepted) = &result {
            let mine = Reveal {
                endpoint: UNDER_TEST_REVEAL.to_vec(),
                app_data: UNDER_TEST_REVEAL.to_vec(),
            };
            // The peer may have gone: the answer is best effort here.
            let _ = accepted.answer(&mut server_io, "fuzz-client", mine).await;
        }
        drop(server_io);
        result
    };
    let mut wrote = Vec::new();
    let peer_side = async {
        if proven {
            let (mut client_io, mut relay) = tokio::io::duplex(PIPE_BYTES);
            let client = async move {
                let _ = handshake::client(
                    &mut client_io,
                    "fuzz-server",
                    local(secret, COUNTERPART_NODE_ID),
                    TIMEOUT,
                    || {
                        Ok(Reveal {
                            endpoint: b"counterpart endpoint".to_vec(),
                            app_data: b"counterpart data".to_vec(),
                        })
                    },
                )
                .await;
            };
            let relayed = async {
                // Hello to the server, its challenge back, the proof to
                // the server; the client's endpoint message is replaced by
                // the input.
                if let Some(hello) = relay_frame(&mut relay).await {
                    let _ = peer.write_all(&hello).await;
                    if let Some(challenge) = relay_frame(&mut peer).await {
                        wrote.extend_from_slice(&challenge);
                        let _ = relay.write_all(&challenge).await;
                        if let Some(proof) = relay_frame(&mut relay).await {
                            let _ = peer.write_all(&proof).await;
                        }
                    }
                }
                // The counterpart hears no more: it gives up.
                let _ = relay.shutdown().await;
                send_close_and_drain(&mut peer, bytes, &mut wrote).await;
            };
            tokio::join!(client, relayed);
        } else {
            send_close_and_drain(&mut peer, bytes, &mut wrote).await;
        }
    };
    let (result, ()) = tokio::join!(server, peer_side);
    run.wrote = wrote;
    match result {
        Ok(accepted) => {
            run.accepted = Some((accepted.peer.node_id, accepted.peer.reveal.clone()));
        }
        Err(e) => run.error = Some(e.to_string()),
    }
    run
}

async fn client_under_test(
    secret: &Secret,
    proven: bool,
    bytes: &[u8],
    mut run: HandshakeRun,
) -> HandshakeRun {
    let (mut client_io, mut peer) = tokio::io::duplex(PIPE_BYTES);
    let revealed = std::sync::atomic::AtomicBool::new(false);
    let revealed_flag = &revealed;
    let client = async move {
        let result = handshake::client(
            &mut client_io,
            "fuzz-server",
            local_under_test(secret),
            TIMEOUT,
            || {
                revealed_flag.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok(Reveal {
                    endpoint: UNDER_TEST_REVEAL.to_vec(),
                    app_data: UNDER_TEST_REVEAL.to_vec(),
                })
            },
        )
        .await;
        drop(client_io);
        result
    };
    let mut wrote = Vec::new();
    let peer_side = async {
        if proven {
            let (mut server_io, mut relay) = tokio::io::duplex(PIPE_BYTES);
            let server = async move {
                let _ = handshake::server(
                    &mut server_io,
                    "fuzz-client",
                    local(secret, COUNTERPART_NODE_ID),
                    TIMEOUT,
                )
                .await;
            };
            let relayed = async {
                // The client's hello to the server, its challenge back;
                // the input then stands for the server's answer.
                if let Some(hello) = relay_frame(&mut peer).await {
                    wrote.extend_from_slice(&hello);
                    let _ = relay.write_all(&hello).await;
                    if let Some(challenge) = relay_frame(&mut relay).await {
                        let _ = peer.write_all(&challenge).await;
                    }
                }
                // The counterpart hears no more: it gives up.
                let _ = relay.shutdown().await;
                send_close_and_drain(&mut peer, bytes, &mut wrote).await;
            };
            tokio::join!(server, relayed);
        } else {
            send_close_and_drain(&mut peer, bytes, &mut wrote).await;
        }
    };
    let (result, ()) = tokio::join!(client, peer_side);
    run.wrote = wrote;
    run.revealed = revealed.load(std::sync::atomic::Ordering::SeqCst);
    match result {
        Ok(info) => run.accepted = Some((info.node_id, info.reveal)),
        Err(e) => run.error = Some(e.to_string()),
    }
    run
}

/// The bytes that crossed a stream in each direction.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    /// From the side that connected (the handshake's client).
    pub from_client: Vec<u8>,
    /// From the side that listened (the handshake's server).
    pub from_server: Vec<u8>,
}

/// Copies `from` to `to` until `from` ends, keeping a copy in `record`;
/// then closes `to`'s write side.
async fn pump<R: AsyncRead + Unpin, W: tokio::io::AsyncWrite + Unpin>(
    mut from: R,
    mut to: W,
    record: &mut Vec<u8>,
) {
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        match from.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                record.extend_from_slice(&chunk[..n]);
                if to.write_all(&chunk[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown().await;
}

/// A whole handshake between the real client and server (the secret of
/// [`run_handshake`]), through a relay that records it: the client's
/// hello, proof and endpoint message, the server's challenge and answer.
pub async fn record_handshake(client_reveal: Reveal, server_reveal: Reveal) -> Recorded {
    let secret = Secret::new(HANDSHAKE_SECRET).expect("a long enough secret");
    let (mut client_io, client_end) = tokio::io::duplex(PIPE_BYTES);
    let (mut server_io, server_end) = tokio::io::duplex(PIPE_BYTES);
    let mut recorded = Recorded::default();
    let client = async {
        let result = handshake::client(
            &mut client_io,
            "recorded-server",
            local(&secret, COUNTERPART_NODE_ID),
            TIMEOUT,
            || Ok(client_reveal),
        )
        .await;
        drop(client_io);
        result.expect("the real client completes the handshake");
    };
    let server = async {
        let accepted = handshake::server(
            &mut server_io,
            "recorded-client",
            local(&secret, UNDER_TEST_NODE_ID),
            TIMEOUT,
        )
        .await
        .expect("the real server accepts the real client");
        accepted
            .answer(&mut server_io, "recorded-client", server_reveal)
            .await
            .expect("the server answers");
        drop(server_io);
    };
    let (client_read, client_write) = tokio::io::split(client_end);
    let (server_read, server_write) = tokio::io::split(server_end);
    let relay = async {
        tokio::join!(
            pump(client_read, server_write, &mut recorded.from_client),
            pump(server_read, client_write, &mut recorded.from_server),
        );
    };
    tokio::join!(client, server, relay);
    recorded
}

/// Splits `stream` after its first `frames` length-prefixed frames (the
/// handshake's, on a `tcp` connection): the handshake's bytes, then the
/// rest. `None` if the stream holds fewer.
pub fn split_after_frames(stream: &[u8], frames: usize) -> Option<(&[u8], &[u8])> {
    let mut at = 0usize;
    for _ in 0..frames {
        let len = stream.get(at..at + 4)?;
        let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
        at = at.checked_add(4 + len).filter(|end| *end <= stream.len())?;
    }
    Some(stream.split_at(at))
}

/// Frames of the handshake a `tcp` connection starts with, sent by the
/// client (hello, proof, endpoint) and by the server (challenge, answer).
pub const HANDSHAKE_FRAMES: (usize, usize) = (3, 2);

/// Real traffic of the `tcp` backend, recorded by a relay between two
/// devices on loopback: the handshake, then WRITEs (with and without
/// immediate), READs, compare-and-swaps, fetch-and-adds and SENDs in both
/// directions with their answers, then the close. The relay gives up
/// after `limit` (what it recorded by then is kept).
///
/// # Errors
///
/// A device that does not listen, connect or execute what it is asked.
pub async fn record_tcp_traffic(limit: Duration) -> Result<Recorded> {
    use crate::api::{Device, DeviceConfig, reveal_to_all};
    use crate::types::{Access, DeviceLimits};

    let secret = Secret::new(HANDSHAKE_SECRET)?;
    let device = |node_id| {
        Device::tcp(DeviceConfig {
            node_id,
            secret: secret.clone(),
            limits: DeviceLimits::default(),
        })
    };
    let (server, client) = (device(UNDER_TEST_NODE_ID), device(COUNTERPART_NODE_ID));
    let config = ConnConfig::default();
    let buffer = server.register_buffer(4096, Access::ALL_REMOTE | Access::LOCAL_WRITE)?;
    let remote = buffer.remote();
    let mut listener = server
        .listen(
            "127.0.0.1:0",
            config.clone(),
            reveal_to_all(b"server app data".to_vec()),
        )
        .await?;
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(crate::error::TransportError::io("fuzzing relay bind"))?;
    let proxy_addr = proxy
        .local_addr()
        .map_err(crate::error::TransportError::io("fuzzing relay address"))?
        .to_string();
    let target = listener.local_addr();
    let recorded = std::sync::Arc::new(std::sync::Mutex::new(Recorded::default()));
    let relay = {
        let recorded = recorded.clone();
        tokio::spawn(async move {
            let Ok((inbound, _)) = proxy.accept().await else {
                return;
            };
            let Ok(outbound) = tokio::net::TcpStream::connect(&target).await else {
                return;
            };
            let (in_read, in_write) = inbound.into_split();
            let (out_read, out_write) = outbound.into_split();
            let (mut from_client, mut from_server) = (Vec::new(), Vec::new());
            tokio::join!(
                pump(in_read, out_write, &mut from_client),
                pump(out_read, in_write, &mut from_server),
            );
            *recorded.lock().expect("not poisoned") = Recorded {
                from_client,
                from_server,
            };
        })
    };
    let (accepted, connected) = tokio::join!(
        listener.accept(),
        client.connect(&proxy_addr, config, b"client app data".to_vec())
    );
    let connected = connected?;
    let accepted = accepted.ok_or_else(|| {
        crate::error::TransportError::Config("the listener accepted nothing".into())
    })?;
    let at = |offset| remote.at(offset, 8).expect("inside the buffer");
    connected.write(at(0), b"one-sided write").await?;
    connected
        .post_write_imm(at(64), b"write with immediate", 7)?
        .await?;
    connected.read(at(0), 15).await?;
    connected.compare_swap(at(128), 0, 42).await?;
    connected.fetch_add(at(128), 1).await?;
    connected.send(b"two-sided send").await?;
    accepted.recv().await?;
    accepted.recv().await?;
    accepted.send(b"an answer").await?;
    connected.recv().await?;
    connected.close();
    accepted.close();
    drop((connected, accepted, listener));
    let _ = tokio::time::timeout(limit, relay).await;
    let recorded = recorded.lock().expect("not poisoned").clone();
    Ok(recorded)
}
