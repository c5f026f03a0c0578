//! Adoption of what a remote writer (a fence holder, maybe a faulty one)
//! put beyond the tail: `Ring::adopt` must accept or refuse any bytes and
//! any control message, never panic; what it adopts must be readable and
//! recovered after a restart.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringraft_wal::{AdoptRequest, Epoch, Wal};
use ringraft_wal_fuzz::{
    ADOPT_OFF_TAIL, ADOPT_PURGE, ADOPT_RESEAL, AdoptInput, adopt_config, adopt_setup, clear_dir,
    place_wrapping, reseal_records, ring_dir_of, scratch_dir,
};

fuzz_target!(|input: &[u8]| {
    let input = AdoptInput::parse(input);
    let dir = scratch_dir();
    clear_dir(dir);
    let config = adopt_config();
    let mut wal = Wal::open(dir, &ring_dir_of(dir), &config).expect("a fresh data directory");
    adopt_setup(
        &mut wal,
        input.local_entries,
        input.flags & ADOPT_PURGE != 0,
    );

    // The writer fenced in (its epoch, or just above the fence).
    let fence = wal.ring().fence();
    let epoch = Epoch(input.epoch.max(fence.0.saturating_add(1)));
    if epoch <= fence {
        return;
    }
    wal.ring()
        .compare_exchange_fence(fence, epoch)
        .expect("the fence moves upward");

    // Its one-sided WRITE at the tail.
    let tail = wal.ring().tail_lsn();
    let data = wal.ring().regions().data;
    // SAFETY: the region is the ring's data area, alive while `wal` is; no
    // other writer exists in this process.
    let area = unsafe { std::slice::from_raw_parts_mut(data.addr, data.len) };
    let mut scratch = area.to_vec();
    place_wrapping(&mut scratch, tail, &input.bytes);
    if input.flags & ADOPT_RESEAL != 0 {
        reseal_records(&mut scratch);
    }
    // Only the bytes it wrote change (all beyond the adopted tail); the
    // CRCs were resealed as they cover the area after the write.
    let span = input.bytes.len().min(area.len());
    let start = (tail % area.len() as u64) as usize;
    for offset in 0..span {
        let physical = (start + offset) % area.len();
        area[physical] = scratch[physical];
    }

    let from_lsn = if input.flags & ADOPT_OFF_TAIL != 0 {
        tail + 64
    } else {
        tail
    };
    let request = AdoptRequest {
        from_lsn,
        to_lsn: from_lsn.saturating_add(input.span),
        entries: input.entries,
        last: input.last,
    };
    let before = (wal.ring().next_index(), wal.ring().tail_lsn());
    let Ok(extended) = wal.ring_mut().adopt(request) else {
        assert_eq!(
            (wal.ring().next_index(), wal.ring().tail_lsn()),
            before,
            "a refused adoption changes nothing"
        );
        return;
    };
    let ring = wal.ring();
    assert_eq!(extended.tail_lsn, ring.tail_lsn());
    assert_eq!(extended.last, ring.last_log());
    assert!(ring.tail_lsn() <= ring.window_end());
    let adopted: Vec<_> = (ring.first_index()..ring.next_index())
        .map(|index| {
            let entry = ring
                .read(index)
                .unwrap_or_else(|err| panic!("adopted entry {index} is unreadable: {err}"));
            (entry.index, entry.term, entry.payload.to_vec())
        })
        .collect();
    wal.ring_mut().sync().expect("sync");
    let tail = wal.ring().tail_lsn();
    drop(wal);

    // Recovery finds at least what was adopted, unchanged.
    let wal = Wal::open(dir, &ring_dir_of(dir), &config).expect("reopen");
    let ring = wal.ring();
    assert!(ring.tail_lsn() >= tail, "recovery lost adopted bytes");
    for (index, term, payload) in adopted {
        let entry = ring
            .read(index)
            .unwrap_or_else(|err| panic!("adopted entry {index} is not recovered: {err}"));
        assert_eq!((entry.term, entry.payload), (term, &payload[..]));
    }
});
