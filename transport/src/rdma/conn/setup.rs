//! Queue pair setup: [`QpResources`], the completion queue, the queue pair
//! (RESET -> INIT), the staging and receive registrations and the first
//! receives, then INIT -> RTR -> RTS towards the peer's endpoint.
//!
//! Owns the resources until `RdmaConnection::start` takes them. Never: drop
//! a buffer before the queue pair that names it (field order is drop
//! order), or post sends (the connection is not ready yet).

use super::*;

/// A queue pair and its buffers, before it is connected.
pub(crate) struct QpResources {
    // Field order is drop order: the queue pair first, then what it names.
    pub(super) qp: QueuePair,
    pub(super) cq: Arc<CompletionQueue>,
    pub(super) send_staging: DeviceBuffer,
    pub(super) recv_buffers: DeviceBuffer,
    pub(super) pd: Arc<ProtectionDomain>,
    pub(super) recv: RecvState,
    pub(super) sizing: Sizing,
    pub(super) psn: u32,
    pub(super) port: u8,
    pub(super) port_attributes: PortAttributes,
    pub(super) gid_index: u8,
    pub(super) gid: Gid,
    pub(super) slot: ConnSlot,
}

impl QpResources {
    /// Creates the completion queue, the queue pair (in INIT, every remote
    /// access allowed) and the buffers, and posts `recv_depth` receives.
    /// `local_ip` is the bootstrap socket's address (picks the GID).
    pub(crate) fn create(
        device: &RdmaDevice,
        config: &ConnConfig,
        local_ip: Option<std::net::IpAddr>,
        slot: ConnSlot,
    ) -> Result<QpResources> {
        let name = device.name();
        let io = |what: &str| TransportError::io(format!("{what} on {name}"));
        let port_attributes = device.port_attributes()?;
        let a = &device.attributes;
        let sizing = Sizing::of(
            config,
            a.max_qp_wr,
            a.max_cqe,
            a.max_qp_init_rd_atom,
            a.max_qp_rd_atom,
            port_attributes.max_msg_sz,
        )?;
        let (gid_index, gid) = device.local_gid(local_ip)?;
        let cq = CompletionQueue::new(&device.context, sizing.cq_entries)
            .map_err(io("ibv_create_cq"))?;
        let qp = QueuePair::new(
            &device.pd,
            &cq,
            QueuePairCaps {
                max_send_wr: config.max_outstanding,
                max_recv_wr: sizing.recv_slots,
            },
        )
        .map_err(io("ibv_create_qp"))?;
        qp.to_init(device.port, AccessFlags::from_access(Access::ALL_REMOTE))
            .map_err(io("ibv_modify_qp RESET->INIT"))?;
        let send_staging =
            DeviceBuffer::new(&device.pd, sizing.ring_bytes).map_err(io("staging registration"))?;
        let recv_bytes = sizing.recv_slots as usize * sizing.recv_slot_bytes as usize;
        let recv_buffers =
            DeviceBuffer::new(&device.pd, recv_bytes).map_err(io("receive buffer registration"))?;
        let mut recv = RecvState {
            free: (0..sizing.recv_slots).rev().collect(),
            posted: vec![false; sizing.recv_slots as usize],
            queue: VecDeque::new(),
        };
        post_receives(
            &qp,
            &recv_buffers,
            sizing.recv_slot_bytes,
            &mut recv,
            config.recv_depth,
        )?;
        Ok(QpResources {
            qp,
            cq,
            send_staging,
            recv_buffers,
            pd: device.pd.clone(),
            recv,
            sizing,
            psn: rand::random::<u32>() & MAX_24_BIT,
            port: device.port,
            port_attributes,
            gid_index,
            gid,
            slot,
        })
    }

    /// What the peer needs to know of this queue pair.
    pub(crate) fn endpoint(&self) -> QpEndpoint {
        QpEndpoint {
            qpn: self.qp.qpn(),
            psn: self.psn,
            gid: self.gid.0,
            lid: self.port_attributes.lid,
            mtu: u8::try_from(self.port_attributes.active_mtu)
                .unwrap_or(1)
                .clamp(1, 5),
            recv_buffer_bytes: self.sizing.recv_slot_bytes,
            max_dest_rd_atomic: self.sizing.responder_depth,
        }
    }

    /// INIT -> RTR -> RTS towards `peer`.
    pub(crate) fn bring_up(&self, peer: &QpEndpoint, config: &ConnConfig) -> Result<()> {
        let io = |what: &str| {
            TransportError::io(format!("ibv_modify_qp {what} (peer qpn {:#x})", peer.qpn))
        };
        let our_mtu = u8::try_from(self.port_attributes.active_mtu)
            .unwrap_or(1)
            .clamp(1, 5);
        self.qp
            .to_rtr(&ReadyToReceive {
                port: self.port,
                path_mtu: u32::from(our_mtu.min(peer.mtu)),
                dest_qpn: peer.qpn,
                rq_psn: peer.psn,
                max_dest_rd_atomic: self.sizing.responder_depth,
                min_rnr_timer: rnr_timer_code(config.rnr_delay),
                global: self.port_attributes.link_layer == LINK_LAYER_ETHERNET,
                dgid: Gid(peer.gid),
                sgid_index: self.gid_index,
                dlid: peer.lid,
            })
            .map_err(io("INIT->RTR"))?;
        self.qp
            .to_rts(&ReadyToSend {
                sq_psn: self.psn,
                timeout: config.ack_timeout_exp.clamp(1, 31),
                retry_cnt: config.retry_count.min(ConnConfig::MAX_RETRY),
                rnr_retry: config.rnr_retry.min(ConnConfig::MAX_RETRY),
                max_rd_atomic: self.sizing.initiator_depth.min(peer.max_dest_rd_atomic),
            })
            .map_err(io("RTR->RTS"))
    }
}
