//! Connection setup over a TCP bootstrap stream, one per RDMA connection:
//! the authenticated handshake of [`crate::handshake`] (backend `rdma`),
//! in which each side reveals its queue pair's endpoint
//! ([`super::endpoint`]) only after the other proved the cluster secret,
//! then the queue pair transitions, then a ready byte.
//!
//! ```text
//! client                                   server
//! TCP connect; create QP (INIT),
//!   post recv_depth receives
//! handshake: Hello ->  <- Challenge        (server proves the secret)
//!   Proof, Endpoint{qp, app data} ->       checks the proof, the endpoint,
//!                                          the connection limit, the policy;
//!                                          creates its QP, INIT->RTR->RTS
//!                            <- Endpoint{qp, policy's app data}
//! INIT->RTR->RTS
//! READY (1 byte 0x52) ->                   accept() yields the connection
//! ```
//!
//! When `connect` returns, both queue pairs are in RTS; when `accept`
//! yields, too (the server waits for READY), so either side may post at
//! once. The stream then stays open as the connection's close channel (see
//! [`super::conn`]). Failed or unauthenticated attempts count in
//! `rejected` and never end the listener; the peer proves the secret
//! within `auth_timeout` of being accepted, and the device's gate caps the
//! connections that have not yet (the accept loop, the gate, listening and
//! dialling are [`crate::bootstrap`]'s, shared with the `tcp` backend).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::conn::{QpResources, RdmaConnection};
use super::device::RdmaDevice;
use super::endpoint::QpEndpoint;
use crate::api::AcceptPolicy;
use crate::bootstrap;
use crate::error::{Result, TransportError};
use crate::gate::Gate;
use crate::handshake::{self, Reveal};
use crate::types::{Backend, ConnConfig};

/// The byte a client sends once its queue pair is in RTS.
const READY: u8 = 0x52;

/// Accepts authenticated RDMA connections: `accept` yields each once both
/// queue pairs are in RTS; failed attempts (bad secret, garbage, timeout, a
/// limit, the policy's refusal, queue pair setup) count in `rejected` on
/// any listener of the device, as the tcp backend counts them.
pub type RdmaListener = bootstrap::Listener<RdmaConnection>;

/// The rdma backend's side of a bootstrap stream: the handshake, the
/// queue pair brought up, then the client's ready byte.
impl bootstrap::Accept for RdmaDevice {
    type Connection = RdmaConnection;
    const REJECTED_WHAT: &'static str = "rdma connection attempt rejected";

    fn rejected(&self) -> &Arc<AtomicU64> {
        &self.rejected
    }

    fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }

    fn local(&self) -> handshake::Local<'_> {
        handshake::Local {
            secret: &self.config.secret,
            backend: Backend::Rdma,
            node_id: self.config.node_id,
            // A real device: an unpredictable nonce.
            nonce: handshake::fresh_nonce(),
        }
    }

    async fn accept_one(
        &self,
        mut stream: TcpStream,
        peer: &str,
        accepted: handshake::Accepted,
        config: &ConnConfig,
        policy: &AcceptPolicy,
    ) -> Result<RdmaConnection> {
        let local_ip = stream.local_addr().ok().map(|a| a.ip());
        let (theirs, slot, app_data) = accepted
            .admit(
                &mut stream,
                peer,
                QpEndpoint::decode,
                || self.reserve_connection(),
                policy,
            )
            .await?;
        let resources = match QpResources::create(self, config, local_ip, slot)
            .and_then(|r| r.bring_up(&theirs, config).map(|()| r))
        {
            Ok(r) => r,
            Err(e) => {
                return Err(accepted
                    .refuse(&mut stream, peer, format!("queue pair setup failed: {e}"))
                    .await);
            }
        };
        accepted
            .answer(
                &mut stream,
                peer,
                Reveal {
                    endpoint: resources.endpoint().encode(),
                    app_data,
                },
            )
            .await?;
        let mut ready = [0u8; 1];
        match tokio::time::timeout(config.handshake_timeout, stream.read_exact(&mut ready)).await {
            Ok(Ok(_)) if ready[0] == READY => {}
            Ok(Ok(_)) => {
                return Err(TransportError::Protocol {
                    peer: peer.to_string(),
                    reason: format!("expected the ready byte, got {:#x}", ready[0]),
                });
            }
            Ok(Err(e)) => {
                return Err(TransportError::io(format!(
                    "waiting for {peer} to be ready"
                ))(e));
            }
            Err(_) => {
                return Err(TransportError::Timeout {
                    what: format!("{peer} bringing its queue pair up"),
                    after_ms: config.handshake_timeout.as_millis() as u64,
                });
            }
        }
        RdmaConnection::start(
            resources,
            config.clone(),
            peer.to_string(),
            accepted.peer,
            stream,
        )
    }
}

pub(crate) async fn connect(
    device: Arc<RdmaDevice>,
    addr: &str,
    config: ConnConfig,
    app_data: Vec<u8>,
) -> Result<RdmaConnection> {
    let slot = device.reserve_connection()?;
    let mut stream = bootstrap::dial(addr, config.handshake_timeout).await?;
    let local_ip = stream.local_addr().ok().map(|a| a.ip());
    let resources = QpResources::create(&device, &config, local_ip, slot)?;
    let ours = resources.endpoint();
    let info = handshake::client(
        &mut stream,
        addr,
        handshake::Local {
            secret: &device.config.secret,
            backend: Backend::Rdma,
            node_id: device.config.node_id,
            // A real device: an unpredictable nonce.
            nonce: handshake::fresh_nonce(),
        },
        config.handshake_timeout,
        // Built only once the server has proven the secret.
        || {
            Ok(Reveal {
                endpoint: ours.encode(),
                app_data,
            })
        },
    )
    .await?;
    // The server proved the secret: its address is a member's, let in
    // past the cap on strangers when it connects to us.
    if let Ok(server) = stream.peer_addr() {
        device.gate.learn(server.ip());
    }
    let theirs = QpEndpoint::decode(&info.reveal.endpoint, addr)?;
    resources.bring_up(&theirs, &config)?;
    stream
        .write_all(&[READY])
        .await
        .map_err(TransportError::io(format!("telling {addr} we are ready")))?;
    RdmaConnection::start(resources, config, addr.to_string(), info, stream)
}
