//! [`LocalPeer`]: side B in the same process (the in-process fabric, TCP
//! over loopback, or one rxe device looping to itself).
//!
//! Owns B's regions, listener and current connection. Never: run a check
//! itself (side A does), or hide B's errors from A (they are returned as
//! strings).

use super::*;

/// Side B in the same process.
pub struct LocalPeer {
    device: Device,
    regions: HashMap<String, Buffer>,
    listener: Option<Listener>,
    current: Option<Connection>,
    app_data: Vec<u8>,
    listen_addr: String,
    advertised_host: Option<String>,
}

impl LocalPeer {
    /// B on `device`, listening at `listen_addr` (`127.0.0.1:0` for tcp,
    /// a name for inproc).
    pub fn new(device: Device, listen_addr: &str) -> LocalPeer {
        LocalPeer {
            device,
            regions: HashMap::new(),
            listener: None,
            current: None,
            app_data: b"side B".to_vec(),
            listen_addr: listen_addr.to_string(),
            advertised_host: None,
        }
    }

    /// Tells clients to connect to `host` (with the bound port) when the
    /// listener binds a wildcard address.
    pub fn advertise(mut self, host: &str) -> LocalPeer {
        self.advertised_host = Some(host.to_string());
        self
    }

    fn region(&self, name: &str) -> Result<&Buffer, String> {
        self.regions
            .get(name)
            .ok_or_else(|| format!("no region {name}"))
    }

    fn conn(&self) -> Result<&Connection, String> {
        self.current
            .as_ref()
            .ok_or_else(|| "no current connection".to_string())
    }
}

impl Peer for LocalPeer {
    async fn setup(&mut self, specs: &[RegionSpec]) -> Result<Vec<RemoteRegion>, String> {
        let mut out = Vec::new();
        for s in specs {
            let buffer = self
                .device
                .register_buffer(s.len as usize, s.access)
                .map_err(|e| e.to_string())?;
            out.push(buffer.remote());
            self.regions.insert(s.name.clone(), buffer);
        }
        Ok(out)
    }

    async fn listen(&mut self, config: ConnConfig) -> Result<String, String> {
        self.listener = None;
        let listener = self
            .device
            .listen(
                &self.listen_addr,
                config,
                reveal_to_all(self.app_data.clone()),
            )
            .await
            .map_err(|e| e.to_string())?;
        let mut addr = listener.local_addr();
        if let (Some(host), Some((_, port))) = (&self.advertised_host, addr.rsplit_once(':')) {
            addr = format!("{host}:{port}");
        }
        self.listener = Some(listener);
        Ok(addr)
    }

    async fn accepted(&mut self) -> Result<(), String> {
        let listener = self.listener.as_mut().ok_or("not listening")?;
        let conn = tokio::time::timeout(Duration::from_secs(10), listener.accept())
            .await
            .map_err(|_| "accept timed out".to_string())?
            .ok_or("listener closed")?;
        self.current = Some(conn);
        Ok(())
    }

    async fn rotate(&mut self, name: &str) -> Result<RemoteRegion, String> {
        let buffer = self
            .regions
            .get_mut(name)
            .ok_or_else(|| format!("no region {name}"))?;
        buffer.region_mut().rotate().map_err(|e| e.to_string())
    }

    async fn set_remote_access(&mut self, access: Access) -> Result<(), String> {
        self.conn()?
            .set_remote_access(access)
            .map_err(|e| e.to_string())
    }

    async fn post_recv(&mut self, count: u32) -> Result<(), String> {
        self.conn()?.post_recv(count).map_err(|e| e.to_string())
    }

    async fn recv(&mut self) -> Result<Received, String> {
        let conn = self.conn()?.clone();
        tokio::time::timeout(Duration::from_secs(10), conn.recv())
            .await
            .map_err(|_| "recv timed out".to_string())?
            .map_err(|e| e.to_string())
    }

    async fn read_local(&mut self, name: &str, offset: u32, len: u32) -> Result<Vec<u8>, String> {
        self.region(name)?
            .read(offset as usize, len as usize)
            .map_err(|e| e.to_string())
    }

    async fn close(&mut self) -> Result<(), String> {
        if let Some(conn) = self.current.take() {
            conn.close();
        }
        Ok(())
    }

    async fn rejected(&mut self) -> Result<u64, String> {
        Ok(self.listener.as_ref().map_or(0, |l| l.rejected()))
    }
}
