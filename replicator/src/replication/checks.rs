//! What a follower sends (its handshake, its grants, its answers, what its
//! NIC returns to READs) is input from the network: this module checks it
//! before any use, so that a bad value is an error of that exchange, never
//! a panic of the leader; and it sizes batches to a follower's ring. Pure
//! functions: no I/O, no state.

use ringraft_transport::RemoteRegion;

use super::AppendRequest;
use crate::protocol::{Hello, Tail};

/// Checks what a peer revealed in its handshake.
pub(crate) fn check_hello(hello: &Hello) -> Result<(), String> {
    ringraft_wal::layout::check_capacity(hello.capacity).map_err(|e| format!("its ring's {e}"))?;
    for (name, word) in [("fence", &hello.fence), ("head", &hello.head)] {
        check_region(name, word)?;
        if word.len < 8 || !word.addr.is_multiple_of(8) {
            return Err(format!(
                "its {name} word ({} bytes at {:#x}) is not an aligned 8-byte word",
                word.len, word.addr
            ));
        }
    }
    Ok(())
}

pub(crate) fn check_region(name: &str, region: &RemoteRegion) -> Result<(), String> {
    if region.addr.checked_add(region.len).is_none() {
        return Err(format!(
            "its {name} region ({} bytes at {:#x}) wraps the address space",
            region.len, region.addr
        ));
    }
    Ok(())
}

/// Checks the data area a follower granted.
pub(crate) fn check_data_area(data: &RemoteRegion, capacity: u64) -> Result<(), String> {
    check_region("data", data)?;
    if data.len != capacity {
        return Err(format!(
            "its data area of {} bytes is not its ring's capacity {capacity}",
            data.len
        ));
    }
    Ok(())
}

/// Checks a tail a follower reported (in a grant or an answer).
pub(crate) fn check_tail(tail: &Tail, capacity: u64) -> Result<(), String> {
    let line = ringraft_wal::layout::LINE_BYTES as u64;
    if !tail.next_lsn.is_multiple_of(line) {
        return Err(format!(
            "its tail {} is not aligned to {line}-byte lines",
            tail.next_lsn
        ));
    }
    // The wal's bound on positions leaves room for two capacities above
    // it: arithmetic on offsets a peer sent cannot overflow.
    if tail.next_lsn > ringraft_wal::layout::MAX_LSN {
        return Err(format!(
            "its tail {} is beyond the end of the lsn space {}",
            tail.next_lsn,
            ringraft_wal::layout::MAX_LSN
        ));
    }
    if tail.head_lsn > tail.next_lsn {
        return Err(format!(
            "its head {} is beyond its tail {}",
            tail.head_lsn, tail.next_lsn
        ));
    }
    if tail.next_lsn - tail.head_lsn > capacity {
        return Err(format!(
            "its log from head {} to tail {} is longer than its capacity {capacity}",
            tail.head_lsn, tail.next_lsn
        ));
    }
    Ok(())
}

/// `limit_bytes` (at least one entry), given each entry's encoded payload
/// length. Returns the last entry kept when it cut anything.
pub(crate) fn cut_to_fit(
    req: &mut AppendRequest,
    payload_lens: impl IntoIterator<Item = usize>,
    limit_bytes: u64,
) -> Option<crate::types::LogId> {
    let mut bytes = 0u64;
    let fits = payload_lens
        .into_iter()
        .take_while(|len| {
            bytes = bytes.saturating_add(ringraft_wal::record::record_len(*len as u64));
            bytes <= limit_bytes
        })
        .count()
        .max(1);
    if fits >= req.entries.len() {
        return None;
    }
    req.entries.truncate(fits);
    req.entries.last().map(|e| e.log_id)
}
