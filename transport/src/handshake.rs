//! The bootstrap handshake: mutual proof of the cluster secret, then the
//! exchange of endpoint descriptions (queue pair numbers, GIDs, region
//! descriptors, application data).
//!
//! Nothing that addresses memory or a queue pair crosses the wire before
//! both sides have proven the secret: an unknown peer learns two random
//! nonces and a MAC.
//!
//! # Messages (each a frame: u32 LE length, then bincode of `Message`)
//!
//! ```text
//! client -> server  Hello     { magic "RRTX", version, backend, node id, client nonce }
//! server -> client  Challenge { server node id, server nonce, server proof }   or Reject
//! client            checks the server proof; stops here if it is wrong
//! client -> server  Proof     { client proof }
//! client -> server  Endpoint  { endpoint, application data }
//! server            checks the client proof; sends Reject and stops if wrong
//! server -> client  Endpoint  { endpoint, application data }
//!
//! server proof = HMAC-SHA256(secret, "ringraft/server" | hello | server id | server nonce)
//! client proof = HMAC-SHA256(secret, "ringraft/client" | hello | server id | server nonce)
//! ```
//!
//! The labels keep one side's proof from being reflected as the other's; the
//! two nonces make every proof fresh.
//!
//! Each side brings its nonce ([`Local::nonce`]): a real device draws it
//! from the OS ([`fresh_nonce`]); only a device seeded explicitly (the
//! in-process fabric's, `crate::entropy`) draws it from its seed.

use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::api::AcceptPolicy;
use crate::error::{Result, TransportError};
use crate::limits::ConnSlot;
use crate::types::Backend;

/// Protocol magic.
pub const MAGIC: [u8; 4] = *b"RRTX";
/// Protocol version.
pub const VERSION: u16 = 1;
/// Largest handshake frame.
pub const MAX_FRAME_BYTES: u32 = 64 << 10;
/// Shortest accepted cluster secret.
pub const MIN_SECRET_BYTES: usize = 16;

type HmacSha256 = Hmac<Sha256>;

/// The cluster secret both ends of a connection must prove.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// Wraps a secret of at least [`MIN_SECRET_BYTES`] bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Secret> {
        let bytes = bytes.into();
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(TransportError::Config(format!(
                "cluster secret of {} bytes is shorter than {MIN_SECRET_BYTES}",
                bytes.len()
            )));
        }
        Ok(Secret(bytes))
    }

    fn mac(&self, label: &[u8], hello: &[u8], server_id: u64, nonce: &[u8; 32]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(label);
        mac.update(hello);
        mac.update(&server_id.to_le_bytes());
        mac.update(nonce);
        mac
    }

    fn proof(&self, label: &[u8], hello: &[u8], server_id: u64, nonce: &[u8; 32]) -> [u8; 32] {
        self.mac(label, hello, server_id, nonce)
            .finalize()
            .into_bytes()
            .into()
    }

    fn verify(
        &self,
        label: &[u8],
        hello: &[u8],
        server_id: u64,
        nonce: &[u8; 32],
        proof: &[u8; 32],
    ) -> bool {
        self.mac(label, hello, server_id, nonce)
            .verify_slice(proof)
            .is_ok()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

const SERVER_LABEL: &[u8] = b"ringraft/server";
const CLIENT_LABEL: &[u8] = b"ringraft/client";

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
enum Message {
    Hello {
        magic: [u8; 4],
        version: u16,
        backend: Backend,
        node_id: u64,
        nonce: [u8; 32],
    },
    Challenge {
        node_id: u64,
        nonce: [u8; 32],
        proof: [u8; 32],
    },
    Proof {
        proof: [u8; 32],
    },
    Endpoint {
        endpoint: Vec<u8>,
        app_data: Vec<u8>,
    },
    Reject {
        reason: String,
    },
}

/// What one side reveals once authenticated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reveal {
    /// Backend-specific endpoint description (queue pair number, GID...).
    pub endpoint: Vec<u8>,
    /// Application data (region descriptors, ...).
    pub app_data: Vec<u8>,
}

/// What the peer revealed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// The peer's node id, as it claimed in its hello (authenticated by the
    /// proof: only a cluster member could have sent it).
    pub node_id: u64,
    /// What it revealed.
    pub reveal: Reveal,
}

fn codec() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<{ MAX_FRAME_BYTES as usize }>()
}

fn encode(message: &Message) -> Vec<u8> {
    bincode::serde::encode_to_vec(message, codec()).expect("handshake messages encode")
}

async fn write_frame<S: AsyncWrite + Unpin>(
    stream: &mut S,
    bytes: &[u8],
    peer: &str,
) -> Result<()> {
    let len = u32::try_from(bytes.len())
        .ok()
        .filter(|l| *l <= MAX_FRAME_BYTES)
        .ok_or(TransportError::Limit {
            what: "handshake frame bytes",
            limit: MAX_FRAME_BYTES as u64,
        })?;
    stream
        .write_all(&len.to_le_bytes())
        .await
        .map_err(TransportError::io(format!("handshake write to {peer}")))?;
    stream
        .write_all(bytes)
        .await
        .map_err(TransportError::io(format!("handshake write to {peer}")))?;
    stream
        .flush()
        .await
        .map_err(TransportError::io(format!("handshake flush to {peer}")))
}

async fn read_frame<S: AsyncRead + Unpin>(stream: &mut S, peer: &str) -> Result<Vec<u8>> {
    let mut len = [0u8; 4];
    stream
        .read_exact(&mut len)
        .await
        .map_err(TransportError::io(format!("handshake read from {peer}")))?;
    let len = u32::from_le_bytes(len);
    if len > MAX_FRAME_BYTES {
        return Err(TransportError::Protocol {
            peer: peer.to_string(),
            reason: format!("handshake frame of {len} bytes (limit {MAX_FRAME_BYTES})"),
        });
    }
    let mut bytes = vec![0u8; len as usize];
    stream
        .read_exact(&mut bytes)
        .await
        .map_err(TransportError::io(format!("handshake read from {peer}")))?;
    Ok(bytes)
}

async fn read_message<S: AsyncRead + Unpin>(
    stream: &mut S,
    peer: &str,
) -> Result<(Message, Vec<u8>)> {
    let bytes = read_frame(stream, peer).await?;
    let (message, used) = bincode::serde::decode_from_slice(&bytes, codec()).map_err(|e| {
        TransportError::Protocol {
            peer: peer.to_string(),
            reason: format!("malformed handshake message: {e}"),
        }
    })?;
    if used != bytes.len() {
        return Err(TransportError::Protocol {
            peer: peer.to_string(),
            reason: "trailing bytes in a handshake message".to_string(),
        });
    }
    Ok((message, bytes))
}

/// An unpredictable nonce from the operating system's entropy: what every
/// real device brings to a handshake.
pub fn fresh_nonce() -> [u8; 32] {
    rand::random()
}

/// This end of a handshake: what it proves itself with.
#[derive(Clone, Copy)]
pub struct Local<'a> {
    /// The cluster secret.
    pub secret: &'a Secret,
    /// This end's backend (both ends must use the same).
    pub backend: Backend,
    /// This end's node id.
    pub node_id: u64,
    /// This handshake's nonce: fresh for every handshake, and unpredictable
    /// on a real device ([`fresh_nonce`]).
    pub nonce: [u8; 32],
}

impl std::fmt::Debug for Local<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Local")
            .field("backend", &self.backend)
            .field("node_id", &self.node_id)
            .finish_non_exhaustive()
    }
}

fn unexpected(peer: &str, got: &Message) -> TransportError {
    match got {
        Message::Reject { reason } => TransportError::Auth {
            peer: peer.to_string(),
            reason: format!("rejected by the peer: {reason}"),
        },
        other => TransportError::Protocol {
            peer: peer.to_string(),
            reason: format!("unexpected handshake message {}", variant(other)),
        },
    }
}

fn variant(m: &Message) -> &'static str {
    match m {
        Message::Hello { .. } => "Hello",
        Message::Challenge { .. } => "Challenge",
        Message::Proof { .. } => "Proof",
        Message::Endpoint { .. } => "Endpoint",
        Message::Reject { .. } => "Reject",
    }
}

async fn bounded<T>(
    timeout: Duration,
    peer: &str,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(timeout, fut)
        .await
        .unwrap_or_else(|_| {
            Err(TransportError::Timeout {
                what: format!("handshake with {peer}"),
                after_ms: timeout.as_millis() as u64,
            })
        })
}

/// Runs the client side over `stream`. `reveal` is only called, and its
/// result only sent, once the server has proven the secret.
pub async fn client<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    peer: &str,
    local: Local<'_>,
    timeout: Duration,
    reveal: impl FnOnce() -> Result<Reveal>,
) -> Result<PeerInfo> {
    let secret = local.secret;
    bounded(timeout, peer, async {
        let hello = encode(&Message::Hello {
            magic: MAGIC,
            version: VERSION,
            backend: local.backend,
            node_id: local.node_id,
            nonce: local.nonce,
        });
        write_frame(stream, &hello, peer).await?;
        let (challenge, _) = read_message(stream, peer).await?;
        let Message::Challenge {
            node_id: server_id,
            nonce,
            proof,
        } = challenge
        else {
            return Err(unexpected(peer, &challenge));
        };
        if !secret.verify(SERVER_LABEL, &hello, server_id, &nonce, &proof) {
            return Err(TransportError::Auth {
                peer: peer.to_string(),
                reason: "the server did not prove the cluster secret".to_string(),
            });
        }
        let mine = reveal()?;
        let proof = secret.proof(CLIENT_LABEL, &hello, server_id, &nonce);
        write_frame(stream, &encode(&Message::Proof { proof }), peer).await?;
        send_reveal(stream, peer, mine).await?;
        let (answer, _) = read_message(stream, peer).await?;
        let Message::Endpoint { endpoint, app_data } = answer else {
            return Err(unexpected(peer, &answer));
        };
        Ok(PeerInfo {
            node_id: server_id,
            reveal: Reveal { endpoint, app_data },
        })
    })
    .await
}

/// The server side, up to the point where the client is authenticated and
/// has revealed its endpoint. The caller then answers with
/// [`Accepted::answer`].
pub async fn server<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    peer: &str,
    local: Local<'_>,
    timeout: Duration,
) -> Result<Accepted> {
    let Local {
        secret,
        backend,
        node_id: node_id_of_server,
        nonce,
    } = local;
    bounded(timeout, peer, async {
        let (hello, hello_bytes) = read_message(stream, peer).await?;
        let Message::Hello {
            magic,
            version,
            backend: theirs,
            node_id,
            ..
        } = hello
        else {
            return Err(unexpected(peer, &hello));
        };
        if magic != MAGIC || version != VERSION {
            return Err(reject(
                stream,
                peer,
                format!("unsupported protocol {magic:?} v{version}"),
            )
            .await);
        }
        if theirs != backend {
            return Err(reject(
                stream,
                peer,
                format!("backend mismatch: server is {backend}, client is {theirs}"),
            )
            .await);
        }
        let proof = secret.proof(SERVER_LABEL, &hello_bytes, node_id_of_server, &nonce);
        let challenge = Message::Challenge {
            node_id: node_id_of_server,
            nonce,
            proof,
        };
        write_frame(stream, &encode(&challenge), peer).await?;
        let (answer, _) = read_message(stream, peer).await?;
        let Message::Proof { proof } = answer else {
            return Err(unexpected(peer, &answer));
        };
        if !secret.verify(
            CLIENT_LABEL,
            &hello_bytes,
            node_id_of_server,
            &nonce,
            &proof,
        ) {
            return Err(reject(
                stream,
                peer,
                "authentication failed: wrong cluster secret".to_string(),
            )
            .await);
        }
        let (endpoint, _) = read_message(stream, peer).await?;
        let Message::Endpoint { endpoint, app_data } = endpoint else {
            return Err(unexpected(peer, &endpoint));
        };
        Ok(Accepted {
            peer: PeerInfo {
                node_id,
                reveal: Reveal { endpoint, app_data },
            },
        })
    })
    .await
}

async fn reject<S: AsyncWrite + Unpin>(
    stream: &mut S,
    peer: &str,
    reason: String,
) -> TransportError {
    // Best effort: the peer learns why, nothing more.
    let _ = write_frame(
        stream,
        &encode(&Message::Reject {
            reason: reason.clone(),
        }),
        peer,
    )
    .await;
    TransportError::Auth {
        peer: peer.to_string(),
        reason,
    }
}

/// Sends what one side reveals after authentication: its endpoint and
/// application data (the client after its proof, the server in its answer).
async fn send_reveal<S: AsyncWrite + Unpin>(
    stream: &mut S,
    peer: &str,
    mine: Reveal,
) -> Result<()> {
    let reveal = Message::Endpoint {
        endpoint: mine.endpoint,
        app_data: mine.app_data,
    };
    write_frame(stream, &encode(&reveal), peer).await
}

/// An authenticated client whose endpoint is known.
#[derive(Debug)]
pub struct Accepted {
    /// The client.
    pub peer: PeerInfo,
}

impl Accepted {
    /// Sends the server's own endpoint and application data.
    pub async fn answer<S: AsyncWrite + Unpin>(
        &self,
        stream: &mut S,
        peer: &str,
        mine: Reveal,
    ) -> Result<()> {
        send_reveal(stream, peer, mine).await
    }

    /// Refuses the authenticated client (a limit, say), telling it why.
    pub async fn refuse<S: AsyncWrite + Unpin>(
        &self,
        stream: &mut S,
        peer: &str,
        reason: String,
    ) -> TransportError {
        reject(stream, peer, reason).await
    }

    /// Admits the authenticated client, with the same checks in the same
    /// order for every backend: its endpoint decodes (`decode_endpoint`,
    /// the backend's format), the device has a connection slot free
    /// (`reserve_connection`), and the accept policy lets it in. The first
    /// check that fails is refused, telling the client why. Yields the
    /// client's endpoint, the slot it holds, and the application data the
    /// policy reveals to it.
    pub(crate) async fn admit<S: AsyncWrite + Unpin, E>(
        &self,
        stream: &mut S,
        peer: &str,
        decode_endpoint: impl FnOnce(&[u8], &str) -> Result<E>,
        reserve_connection: impl FnOnce() -> Result<ConnSlot>,
        policy: &AcceptPolicy,
    ) -> Result<(E, ConnSlot, Vec<u8>)> {
        let endpoint = match decode_endpoint(&self.peer.reveal.endpoint, peer) {
            Ok(e) => e,
            Err(e) => return Err(self.refuse(stream, peer, e.to_string()).await),
        };
        let slot = match reserve_connection() {
            Ok(slot) => slot,
            Err(e) => return Err(self.refuse(stream, peer, e.to_string()).await),
        };
        let app_data = match policy(&self.peer) {
            Ok(data) => data,
            Err(reason) => return Err(self.refuse(stream, peer, reason).await),
        };
        Ok((endpoint, slot, app_data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(s: &str) -> Secret {
        Secret::new(format!("{s:0>16}")).unwrap()
    }

    fn side(secret: &Secret, node_id: u64) -> Local<'_> {
        Local {
            secret,
            backend: Backend::Tcp,
            node_id,
            nonce: fresh_nonce(),
        }
    }

    async fn run(
        client_secret: Secret,
        server_secret: Secret,
    ) -> (Result<PeerInfo>, Result<Accepted>) {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let t = Duration::from_secs(5);
        let srv = tokio::spawn(async move {
            let r = server(&mut b, "client", side(&server_secret, 4), t).await;
            if let Ok(acc) = &r {
                acc.answer(
                    &mut b,
                    "client",
                    Reveal {
                        endpoint: b"S".to_vec(),
                        app_data: b"server-data".to_vec(),
                    },
                )
                .await
                .unwrap();
            }
            r
        });
        let c = client(&mut a, "server", side(&client_secret, 9), t, || {
            Ok(Reveal {
                endpoint: b"C".to_vec(),
                app_data: b"client-data".to_vec(),
            })
        })
        .await;
        (c, srv.await.unwrap())
    }

    // Paused time: the handshake timeouts cannot fire while either side
    // still has work, however slow the machine.
    #[tokio::test(start_paused = true)]
    async fn both_sides_prove_the_secret_then_reveal() {
        let (c, s) = run(secret("k"), secret("k")).await;
        let c = c.unwrap();
        assert_eq!(c.node_id, 4);
        assert_eq!(c.reveal.app_data, b"server-data");
        let s = s.unwrap();
        assert_eq!(s.peer.node_id, 9);
        assert_eq!(s.peer.reveal.app_data, b"client-data");
    }

    // Paused time: the handshake timeouts cannot fire while either side
    // still has work, however slow the machine.
    #[tokio::test(start_paused = true)]
    async fn a_wrong_secret_reveals_nothing() {
        let revealed = std::sync::atomic::AtomicBool::new(false);
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let t = Duration::from_secs(5);
        let srv =
            tokio::spawn(async move { server(&mut b, "c", side(&secret("right"), 4), t).await });
        let c = client(&mut a, "s", side(&secret("wrong"), 1), t, || {
            revealed.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(Reveal::default())
        })
        .await;
        assert!(matches!(c, Err(TransportError::Auth { .. })), "{c:?}");
        assert!(
            !revealed.load(std::sync::atomic::Ordering::SeqCst),
            "client revealed to an unproven server"
        );
        drop(a);
        assert!(srv.await.unwrap().is_err());
    }

    // Paused time: the handshake timeouts cannot fire while either side
    // still has work, however slow the machine.
    #[tokio::test(start_paused = true)]
    async fn garbage_and_oversized_frames_are_protocol_errors() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let t = Duration::from_secs(5);
        let srv = tokio::spawn(async move { server(&mut b, "c", side(&secret("k"), 4), t).await });
        a.write_all(&[4, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef])
            .await
            .unwrap();
        assert!(matches!(
            srv.await.unwrap(),
            Err(TransportError::Protocol { .. })
        ));

        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let srv = tokio::spawn(async move { server(&mut b, "c", side(&secret("k"), 4), t).await });
        a.write_all(&u32::MAX.to_le_bytes()).await.unwrap();
        assert!(matches!(
            srv.await.unwrap(),
            Err(TransportError::Protocol { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_times_out() {
        let (_a, mut b) = tokio::io::duplex(1 << 16);
        let r = server(&mut b, "c", side(&secret("k"), 4), Duration::from_secs(2)).await;
        assert!(matches!(r, Err(TransportError::Timeout { .. })));
    }

    #[test]
    fn short_secrets_are_refused() {
        assert!(Secret::new(b"short".to_vec()).is_err());
    }
}
