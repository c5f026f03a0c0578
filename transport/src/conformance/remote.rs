//! [`RemotePeer`] and [`serve`]: side B in another process or guest, driven
//! over a control connection of the same backend, with its own small
//! command protocol.
//!
//! Owns the control protocol (commands, replies, their encoding). Never:
//! trust a control message's bytes (they are decoded with errors), or run
//! a check itself.

use super::*;

/// A command of the control protocol between [`RemotePeer`] and [`serve`].
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Command {
    Setup(Vec<RegionSpec>),
    Listen(WireConfig),
    Accepted,
    Rotate(String),
    SetAccess(Access),
    PostRecv(u32),
    Recv,
    ReadLocal(String, u32, u32),
    Close,
    Rejected,
    Done,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
enum Reply {
    Regions(Vec<RemoteRegion>),
    Addr(String),
    Region(RemoteRegion),
    Received(Option<Vec<u8>>, Option<u32>),
    Bytes(Vec<u8>),
    Count(u64),
    Ok,
    Err(String),
}

/// The parts of [`ConnConfig`] the control protocol carries.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct WireConfig {
    retry_count: u8,
    ack_timeout_exp: u8,
    rnr_retry: u8,
    rnr_delay_us: u64,
    recv_depth: u32,
    auto_repost: bool,
}

impl From<&ConnConfig> for WireConfig {
    fn from(c: &ConnConfig) -> Self {
        WireConfig {
            retry_count: c.retry_count,
            ack_timeout_exp: c.ack_timeout_exp,
            rnr_retry: c.rnr_retry,
            rnr_delay_us: c.rnr_delay.as_micros() as u64,
            recv_depth: c.recv_depth,
            auto_repost: c.auto_repost,
        }
    }
}

impl From<WireConfig> for ConnConfig {
    fn from(w: WireConfig) -> Self {
        ConnConfig {
            retry_count: w.retry_count,
            ack_timeout_exp: w.ack_timeout_exp,
            rnr_retry: w.rnr_retry,
            rnr_delay: Duration::from_micros(w.rnr_delay_us),
            recv_depth: w.recv_depth,
            auto_repost: w.auto_repost,
            ..suite_config()
        }
    }
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(v, bincode::config::standard()).expect("control messages encode")
}

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, String> {
    bincode::serde::decode_from_slice(bytes, bincode::config::standard())
        .map(|(v, _)| v)
        .map_err(|e| format!("bad control message: {e}"))
}

/// The control connection's parameters: messages large enough for a
/// 64 KiB region read back with its framing.
fn control_config() -> ConnConfig {
    ConnConfig {
        max_message_bytes: 1 << 20,
        ..ConnConfig::default()
    }
}

/// Side B in another process, driven over a control connection.
pub struct RemotePeer {
    control: Connection,
}

impl RemotePeer {
    /// Connects to a [`serve`] at `addr` from `device`.
    pub async fn connect(device: &Device, addr: &str) -> Result<RemotePeer, String> {
        let control = device
            .connect(addr, control_config(), b"control".to_vec())
            .await
            .map_err(|e| format!("control connection to {addr}: {e}"))?;
        Ok(RemotePeer { control })
    }

    async fn call(&mut self, command: Command) -> Result<Reply, String> {
        self.control
            .send(&encode(&command))
            .await
            .map_err(|e| e.to_string())?;
        let reply = tokio::time::timeout(Duration::from_secs(30), self.control.recv())
            .await
            .map_err(|_| "control reply timed out".to_string())?
            .map_err(|e| e.to_string())?;
        match reply {
            Received::Message(bytes) => match decode::<Reply>(&bytes)? {
                Reply::Err(e) => Err(format!("peer: {e}")),
                other => Ok(other),
            },
            other => Err(format!("unexpected control message {other:?}")),
        }
    }

    /// Tells the server this run is over.
    pub async fn finish(mut self) -> Result<(), String> {
        self.call(Command::Done).await.map(|_| ())
    }
}

fn bad(reply: Reply) -> String {
    format!("unexpected reply {reply:?}")
}

impl Peer for RemotePeer {
    async fn setup(&mut self, specs: &[RegionSpec]) -> Result<Vec<RemoteRegion>, String> {
        match self.call(Command::Setup(specs.to_vec())).await? {
            Reply::Regions(r) => Ok(r),
            other => Err(bad(other)),
        }
    }
    async fn listen(&mut self, config: ConnConfig) -> Result<String, String> {
        match self.call(Command::Listen((&config).into())).await? {
            Reply::Addr(a) => Ok(a),
            other => Err(bad(other)),
        }
    }
    async fn accepted(&mut self) -> Result<(), String> {
        self.call(Command::Accepted).await.map(|_| ())
    }
    async fn rotate(&mut self, name: &str) -> Result<RemoteRegion, String> {
        match self.call(Command::Rotate(name.to_string())).await? {
            Reply::Region(r) => Ok(r),
            other => Err(bad(other)),
        }
    }
    async fn set_remote_access(&mut self, access: Access) -> Result<(), String> {
        self.call(Command::SetAccess(access)).await.map(|_| ())
    }
    async fn post_recv(&mut self, count: u32) -> Result<(), String> {
        self.call(Command::PostRecv(count)).await.map(|_| ())
    }
    async fn recv(&mut self) -> Result<Received, String> {
        match self.call(Command::Recv).await? {
            Reply::Received(Some(m), None) => Ok(Received::Message(m)),
            Reply::Received(None, Some(imm)) => Ok(Received::WriteImmediate(imm)),
            other => Err(bad(other)),
        }
    }
    async fn read_local(&mut self, name: &str, offset: u32, len: u32) -> Result<Vec<u8>, String> {
        match self
            .call(Command::ReadLocal(name.to_string(), offset, len))
            .await?
        {
            Reply::Bytes(b) => Ok(b),
            other => Err(bad(other)),
        }
    }
    async fn close(&mut self) -> Result<(), String> {
        self.call(Command::Close).await.map(|_| ())
    }
    async fn rejected(&mut self) -> Result<u64, String> {
        match self.call(Command::Rejected).await? {
            Reply::Count(n) => Ok(n),
            other => Err(bad(other)),
        }
    }
}

/// Serves side B: accepts one control connection at `control_addr` and
/// carries out its commands with a [`LocalPeer`] whose data listeners bind
/// `data_addr` (port 0 picks one) and are advertised as `advertised_host`
/// (when given). Returns when the client says it is done.
pub async fn serve(
    device: Device,
    control_addr: &str,
    data_addr: &str,
    advertised_host: Option<&str>,
) -> Result<(), String> {
    let mut control_listener = device
        .listen(
            control_addr,
            control_config(),
            reveal_to_all(b"control".to_vec()),
        )
        .await
        .map_err(|e| e.to_string())?;
    let control = control_listener
        .accept()
        .await
        .ok_or("control listener closed")?;
    let mut local = LocalPeer::new(device, data_addr);
    if let Some(host) = advertised_host {
        local = local.advertise(host);
    }
    loop {
        let message = control
            .recv()
            .await
            .map_err(|e| format!("control recv: {e}"))?;
        let Received::Message(bytes) = message else {
            return Err("unexpected immediate on the control connection".into());
        };
        let command: Command = decode(&bytes)?;
        let done = matches!(command, Command::Done);
        let reply = match command {
            Command::Setup(specs) => local.setup(&specs).await.map(Reply::Regions),
            Command::Listen(config) => local.listen(config.into()).await.map(Reply::Addr),
            Command::Accepted => local.accepted().await.map(|_| Reply::Ok),
            Command::Rotate(name) => local.rotate(&name).await.map(Reply::Region),
            Command::SetAccess(access) => local.set_remote_access(access).await.map(|_| Reply::Ok),
            Command::PostRecv(n) => local.post_recv(n).await.map(|_| Reply::Ok),
            Command::Recv => local.recv().await.map(|r| match r {
                Received::Message(m) => Reply::Received(Some(m), None),
                Received::WriteImmediate(i) => Reply::Received(None, Some(i)),
            }),
            Command::ReadLocal(name, offset, len) => {
                local.read_local(&name, offset, len).await.map(Reply::Bytes)
            }
            Command::Close => local.close().await.map(|_| Reply::Ok),
            Command::Rejected => local.rejected().await.map(Reply::Count),
            Command::Done => Ok(Reply::Ok),
        };
        let reply = reply.unwrap_or_else(Reply::Err);
        control
            .send(&encode(&reply))
            .await
            .map_err(|e| format!("control reply to {done}: {e}"))?;
        if done {
            return Ok(());
        }
    }
}
