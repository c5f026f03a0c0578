//! The reliable-connected queue pair (`ibv_qp`): state transitions and
//! posting.
//!
//! Holds `Arc`s of its protection domain and completion queue; destroyed on
//! drop. Posting is `unsafe`: a posted work request hands local memory to
//! the device until its completion is polled (or the queue pair is
//! destroyed), and the caller must keep that memory alive and untouched.

use std::io;
use std::mem::MaybeUninit;
use std::os::raw::c_int;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdma_sys::{
    atomic_t, ibv_create_qp, ibv_destroy_qp, ibv_modify_qp, ibv_post_recv, ibv_post_send, ibv_qp,
    ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_cap, ibv_qp_init_attr, ibv_qp_state, ibv_qp_type,
    ibv_recv_wr, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wr_opcode, rdma_t,
};

use super::context::{Gid, errno_of};
use super::cq::CompletionQueue;
use super::mr::AccessFlags;
use super::pd::ProtectionDomain;

/// Hop limit of the GRH (RoCEv2 routes over IP).
const HOP_LIMIT: u8 = 64;

/// Receiver-not-ready timer values by code (IB spec table, microseconds);
/// code 0 is the longest.
const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// The `min_rnr_timer` code whose wait is the shortest one at least
/// `delay` long (`delay` above 491.52 ms gets the longest, 655.36 ms).
pub(crate) fn rnr_timer_code(delay: std::time::Duration) -> u8 {
    let us = delay.as_micros();
    (1u8..32)
        .find(|code| u128::from(RNR_TIMER_US[*code as usize]) >= us)
        .unwrap_or(0)
}

/// Work queue sizes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QueuePairCaps {
    /// Send queue entries.
    pub max_send_wr: u32,
    /// Receive queue entries.
    pub max_recv_wr: u32,
}

/// What INIT -> RTR needs to know of the path and the peer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadyToReceive {
    /// Local port.
    pub port: u8,
    /// `ibv_mtu` code of the path.
    pub path_mtu: u32,
    /// The peer's queue pair number.
    pub dest_qpn: u32,
    /// The peer's first send PSN.
    pub rq_psn: u32,
    /// READs/atomics from the peer we serve at once.
    pub max_dest_rd_atomic: u8,
    /// Receiver-not-ready timer code we tell the peer to wait.
    pub min_rnr_timer: u8,
    /// Route with a global header (always on RoCE).
    pub global: bool,
    /// The peer's GID.
    pub dgid: Gid,
    /// Our GID's index.
    pub sgid_index: u8,
    /// The peer's LID (InfiniBand without GRH).
    pub dlid: u16,
}

/// What RTR -> RTS needs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadyToSend {
    /// Our first send PSN.
    pub sq_psn: u32,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Transport retries (at most 6: rxe retries forever at 7).
    pub retry_cnt: u8,
    /// Receiver-not-ready retries (at most 6: 7 means forever).
    pub rnr_retry: u8,
    /// READs/atomics we issue at once.
    pub max_rd_atomic: u8,
}

/// Local memory a work request names: registered bytes and their lkey.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LocalSlice {
    /// First byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Key of the registration the bytes lie in.
    pub lkey: u32,
}

/// A send-queue operation and its remote operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SendOp {
    /// RDMA WRITE (with immediate when `imm` is set, host byte order).
    Write {
        remote_addr: u64,
        rkey: u32,
        imm: Option<u32>,
    },
    /// RDMA READ into the local slice.
    Read { remote_addr: u64, rkey: u32 },
    /// 8-byte compare-and-swap; the old value lands in the local slice.
    CompareSwap {
        remote_addr: u64,
        rkey: u32,
        expected: u64,
        new: u64,
    },
    /// 8-byte fetch-and-add; the old value lands in the local slice.
    FetchAdd {
        remote_addr: u64,
        rkey: u32,
        add: u64,
    },
    /// Two-sided SEND of the local slice.
    Send,
}

/// Inline data sizes a new queue pair asks for, largest first: the first
/// the provider accepts wins (rxe and most RNICs take 256 bytes), and 0
/// (no inline sends) always works.
const INLINE_CHOICES: [u32; 3] = [256, 64, 0];

/// One send-queue work request of a chain: see [`QueuePair::post_sends`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct SendWr {
    /// Our id of the request; its completion carries it.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// Its local bytes: registered staging, or for an inline request any
    /// memory (the lkey is not used) that the provider copies at the post.
    pub local: Option<LocalSlice>,
    /// Whether the device reports its completion when it succeeds (a
    /// failed request is reported either way).
    pub signaled: bool,
    /// Whether the provider copies `local` into the work queue at the post
    /// (`IBV_SEND_INLINE`: WRITE and SEND of at most
    /// [`QueuePair::max_inline`] bytes).
    pub inline: bool,
}

/// An RC queue pair.
pub(crate) struct QueuePair {
    qp: NonNull<ibv_qp>,
    qpn: u32,
    max_inline: u32,
    cq: Arc<CompletionQueue>,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: verbs objects may be used from any thread; the pointer is owned and
// destroyed once.
unsafe impl Send for QueuePair {}
// SAFETY: posting and modifying a queue pair are thread-safe verbs.
unsafe impl Sync for QueuePair {}

fn zeroed_attr() -> ibv_qp_attr {
    // SAFETY: all-zero is a valid `ibv_qp_attr` (integers, and unions/structs
    // of integers).
    unsafe { MaybeUninit::zeroed().assume_init() }
}

impl QueuePair {
    /// Creates an RC queue pair in RESET whose send and receive queues both
    /// report into `cq`. Each send says whether it is signaled; it takes the
    /// largest inline size of [`INLINE_CHOICES`] the provider accepts.
    pub(crate) fn new(
        pd: &Arc<ProtectionDomain>,
        cq: &Arc<CompletionQueue>,
        caps: QueuePairCaps,
    ) -> io::Result<QueuePair> {
        let mut refused = None;
        for inline in INLINE_CHOICES {
            match Self::create(pd, cq, caps, inline) {
                Ok(qp) => return Ok(qp),
                Err(e) => refused = Some(e),
            }
        }
        Err(refused.expect("at least one choice"))
    }

    fn create(
        pd: &Arc<ProtectionDomain>,
        cq: &Arc<CompletionQueue>,
        caps: QueuePairCaps,
        max_inline_data: u32,
    ) -> io::Result<QueuePair> {
        // SAFETY: all-zero is a valid `ibv_qp_init_attr` (null pointers and
        // integers).
        let mut init: ibv_qp_init_attr = unsafe { MaybeUninit::zeroed().assume_init() };
        init.send_cq = cq.as_ptr();
        init.recv_cq = cq.as_ptr();
        init.cap = ibv_qp_cap {
            max_send_wr: caps.max_send_wr,
            max_recv_wr: caps.max_recv_wr,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data,
        };
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        // SAFETY: the protection domain and completion queue are alive (we
        // keep `Arc`s of both until the queue pair is destroyed); `init` is
        // a valid attribute block.
        let qp = unsafe { ibv_create_qp(pd.as_ptr(), &mut init) };
        let qp = NonNull::new(qp).ok_or_else(io::Error::last_os_error)?;
        // SAFETY: `qp` was just created; `qp_num` is set by the provider and
        // never changes.
        let qpn = unsafe { (*qp.as_ptr()).qp_num };
        // The provider writes back what it gives, which may be more than
        // asked for; never use more than asked for.
        let max_inline = init.cap.max_inline_data.min(max_inline_data);
        Ok(QueuePair {
            qp,
            qpn,
            max_inline,
            cq: cq.clone(),
            pd: pd.clone(),
        })
    }

    /// Bytes a WRITE or SEND may carry inline.
    pub(crate) fn max_inline(&self) -> u32 {
        self.max_inline
    }

    /// The queue pair number.
    pub(crate) fn qpn(&self) -> u32 {
        self.qpn
    }

    fn modify(&self, attr: &mut ibv_qp_attr, mask: ibv_qp_attr_mask) -> io::Result<()> {
        // SAFETY: the queue pair is alive; `attr` is a valid attribute block
        // whose fields named in `mask` are set.
        let rc = unsafe { ibv_modify_qp(self.qp.as_ptr(), attr, mask.0 as c_int) };
        if rc != 0 {
            return Err(errno_of(rc));
        }
        Ok(())
    }

    /// RESET -> INIT on `port` with partition key index 0 and the given
    /// remote access.
    pub(crate) fn to_init(&self, port: u8, access: AccessFlags) -> io::Result<()> {
        let mut attr = zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = port;
        attr.qp_access_flags = access.remote_only().bits();
        self.modify(
            &mut attr,
            ibv_qp_attr_mask::IBV_QP_STATE
                | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
                | ibv_qp_attr_mask::IBV_QP_PORT
                | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS,
        )
    }

    /// INIT -> RTR towards the peer.
    pub(crate) fn to_rtr(&self, rtr: &ReadyToReceive) -> io::Result<()> {
        let mut attr = zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
        attr.path_mtu = rtr.path_mtu;
        attr.dest_qp_num = rtr.dest_qpn;
        attr.rq_psn = rtr.rq_psn;
        attr.max_dest_rd_atomic = rtr.max_dest_rd_atomic;
        attr.min_rnr_timer = rtr.min_rnr_timer;
        attr.ah_attr.is_global = u8::from(rtr.global);
        attr.ah_attr.dlid = rtr.dlid;
        attr.ah_attr.sl = 0;
        attr.ah_attr.src_path_bits = 0;
        attr.ah_attr.port_num = rtr.port;
        if rtr.global {
            attr.ah_attr.grh.dgid.raw = rtr.dgid.0;
            attr.ah_attr.grh.sgid_index = rtr.sgid_index;
            attr.ah_attr.grh.hop_limit = HOP_LIMIT;
            attr.ah_attr.grh.traffic_class = 0;
            attr.ah_attr.grh.flow_label = 0;
        }
        self.modify(
            &mut attr,
            ibv_qp_attr_mask::IBV_QP_STATE
                | ibv_qp_attr_mask::IBV_QP_AV
                | ibv_qp_attr_mask::IBV_QP_PATH_MTU
                | ibv_qp_attr_mask::IBV_QP_DEST_QPN
                | ibv_qp_attr_mask::IBV_QP_RQ_PSN
                | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
                | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER,
        )
    }

    /// RTR -> RTS.
    pub(crate) fn to_rts(&self, rts: &ReadyToSend) -> io::Result<()> {
        let mut attr = zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
        attr.sq_psn = rts.sq_psn;
        attr.timeout = rts.timeout;
        attr.retry_cnt = rts.retry_cnt;
        attr.rnr_retry = rts.rnr_retry;
        attr.max_rd_atomic = rts.max_rd_atomic;
        self.modify(
            &mut attr,
            ibv_qp_attr_mask::IBV_QP_STATE
                | ibv_qp_attr_mask::IBV_QP_SQ_PSN
                | ibv_qp_attr_mask::IBV_QP_TIMEOUT
                | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
                | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
                | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC,
        )
    }

    /// RTS -> RTS changing what peers may do through this queue pair.
    pub(crate) fn set_remote_access(&self, access: AccessFlags) -> io::Result<()> {
        let mut attr = zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
        attr.qp_access_flags = access.remote_only().bits();
        self.modify(
            &mut attr,
            ibv_qp_attr_mask::IBV_QP_STATE | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS,
        )
    }

    /// Any state -> ERR: every posted work request completes with
    /// `IBV_WC_WR_FLUSH_ERR`.
    pub(crate) fn to_error(&self) -> io::Result<()> {
        let mut attr = zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut attr, ibv_qp_attr_mask::IBV_QP_STATE)
    }

    /// Posts `wrs` as one chain (one `ibv_post_send`), in order.
    ///
    /// # Errors
    /// The number of requests posted before the provider refused one (the
    /// device owns those), and why.
    ///
    /// # Safety
    /// For each request that is not inline, `local`, when given, must lie
    /// inside a live registration of this queue pair's protection domain
    /// whose lkey it carries, and stay allocated and registered until the
    /// completion of that request or of a later one has been polled from
    /// the completion queue, or the queue pair is destroyed. Until then the
    /// CPU must not write it (WRITE, SEND: the device reads it at any
    /// moment) nor read it (READ, atomics: the device writes it). An inline
    /// request's `local` must be readable for the duration of the call.
    pub(crate) unsafe fn post_sends(&self, wrs: &[SendWr]) -> Result<(), (usize, io::Error)> {
        if wrs.is_empty() {
            return Ok(());
        }
        // Both vectors are complete before any pointer into them is taken.
        let mut sges: Vec<ibv_sge> = wrs
            .iter()
            .map(|w| {
                let l = w.local.unwrap_or(LocalSlice {
                    addr: 0,
                    len: 0,
                    lkey: 0,
                });
                ibv_sge {
                    addr: l.addr,
                    length: l.len,
                    lkey: l.lkey,
                }
            })
            .collect();
        let mut chain: Vec<ibv_send_wr> = wrs
            .iter()
            .map(|w| {
                // SAFETY: all-zero is a valid `ibv_send_wr` (null pointers,
                // integers and unions of those).
                let mut wr: ibv_send_wr = unsafe { MaybeUninit::zeroed().assume_init() };
                wr.wr_id = w.wr_id;
                let mut flags = 0;
                if w.signaled {
                    flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
                }
                if w.inline {
                    flags |= ibv_send_flags::IBV_SEND_INLINE.0;
                }
                wr.send_flags = flags;
                set_send_op(&mut wr, w.op);
                wr
            })
            .collect();
        // Every pointer below derives from these two, taken once.
        let base = chain.as_mut_ptr();
        let sge_base = sges.as_mut_ptr();
        for (i, w) in wrs.iter().enumerate() {
            // SAFETY: `i` (and `i + 1` where used) is inside both vectors,
            // which are neither resized nor otherwise borrowed from here on.
            unsafe {
                let wr = &mut *base.add(i);
                if w.local.is_some() {
                    wr.sg_list = sge_base.add(i);
                    wr.num_sge = 1;
                }
                if i + 1 < wrs.len() {
                    wr.next = base.add(i + 1);
                }
            }
        }
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: the queue pair is alive; the chain and its scatter
        // entries are valid for the duration of the call (the provider
        // copies them, and inline data, into its queue); the caller
        // guarantees the memory the rest name.
        let rc = unsafe { ibv_post_send(self.qp.as_ptr(), base, &mut bad) };
        if rc != 0 {
            // `bad` is the first request not posted; a provider that leaves
            // it unset posted none.
            let posted = if bad.is_null() {
                0
            } else {
                // SAFETY: the provider points `bad` into the chain it was
                // given.
                usize::try_from(unsafe { bad.offset_from(base) }).unwrap_or(0)
            };
            return Err((posted.min(wrs.len()), errno_of(rc)));
        }
        Ok(())
    }

    /// Posts one receive work request into `local`.
    ///
    /// # Safety
    /// `local` must lie inside a live registration with local write access
    /// in this queue pair's protection domain, and stay allocated,
    /// registered, and unread by the CPU until the completion with `wr_id`
    /// has been polled, or the queue pair is destroyed.
    pub(crate) unsafe fn post_recv(&self, wr_id: u64, local: LocalSlice) -> io::Result<()> {
        let mut sge = ibv_sge {
            addr: local.addr,
            length: local.len,
            lkey: local.lkey,
        };
        let mut wr = ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: the queue pair is alive; `wr` and `sge` are valid for the
        // call; the caller guarantees the memory.
        let rc = unsafe { ibv_post_recv(self.qp.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(errno_of(rc));
        }
        Ok(())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_qp`, destroyed once. From here on the
        // device touches none of the memory posted work requests named.
        let rc = unsafe { ibv_destroy_qp(self.qp.as_ptr()) };
        if rc != 0 {
            tracing::warn!(
                device = %self.pd.context().name(),
                qpn = self.qpn,
                cq_entries = self.cq.capacity(),
                error = %errno_of(rc),
                "ibv_destroy_qp failed"
            );
        }
    }
}

/// Sets the opcode of `wr` and the fields of `op` (remote address, rkey,
/// immediate data, atomic operands). Touches nothing else of `wr`.
fn set_send_op(wr: &mut ibv_send_wr, op: SendOp) {
    match op {
        SendOp::Write {
            remote_addr,
            rkey,
            imm,
        } => {
            wr.wr.rdma = rdma_t { remote_addr, rkey };
            match imm {
                Some(imm) => {
                    wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                    wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                }
                None => wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            }
        }
        SendOp::Read { remote_addr, rkey } => {
            wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_READ;
            wr.wr.rdma = rdma_t { remote_addr, rkey };
        }
        SendOp::CompareSwap {
            remote_addr,
            rkey,
            expected,
            new,
        } => {
            wr.opcode = ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP;
            wr.wr.atomic = atomic_t {
                remote_addr,
                compare_add: expected,
                swap: new,
                rkey,
            };
        }
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            wr.opcode = ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
            wr.wr.atomic = atomic_t {
                remote_addr,
                compare_add: add,
                swap: 0,
                rkey,
            };
        }
        SendOp::Send => wr.opcode = ibv_wr_opcode::IBV_WR_SEND,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rnr_timer_codes() {
        assert_eq!(rnr_timer_code(Duration::ZERO), 1);
        assert_eq!(rnr_timer_code(Duration::from_micros(10)), 1);
        assert_eq!(rnr_timer_code(Duration::from_micros(11)), 2);
        assert_eq!(rnr_timer_code(Duration::from_millis(5)), 18, "5.12 ms");
        assert_eq!(rnr_timer_code(Duration::from_millis(10)), 20, "10.24 ms");
        assert_eq!(rnr_timer_code(Duration::from_micros(491_520)), 31);
        assert_eq!(
            rnr_timer_code(Duration::from_secs(1)),
            0,
            "655.36 ms, the longest"
        );
    }
}
