//! What the wal's fuzz targets share: compact descriptions of the inputs
//! they feed the wal (a whole data directory; a remote writer's batch), how
//! to lay them out as real files and memory, and how to make seed inputs
//! from directories the wal itself wrote.
//!
//! A data directory is a megabyte or more, mostly zeroes, and guarded by
//! CRCs that random mutations break at once. So an input holds only the
//! metadata file, the control block's first lines and a run of data-area
//! bytes placed at a chosen offset, and flags ask the harness to reseal the
//! CRCs after mutation, so that the fuzzer gets past them and reaches the
//! code behind.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ringraft_wal::layout::{CONTROL_BLOCK_BYTES, Epoch, LINE_BYTES, MIN_CAPACITY_BYTES};
use ringraft_wal::meta::{META_BYTES, META_FILE};
use ringraft_wal::record::{RECORD_CRC_OFFSET, RECORD_HEADER_BYTES, RECORD_MAGIC};
use ringraft_wal::ring::RING_FILE;
use ringraft_wal::{EntryRef, LogPos, RingConfig, Wal};

/// Largest capacity an input may give its ring: bigger ones would make
/// every run slow. Other values of the header's capacity field are kept in
/// the header but the file is [`MIN_CAPACITY_BYTES`] long.
pub const MAX_FUZZ_CAPACITY: u64 = 4 << 20;

/// Ask the harness to recompute the metadata file's CRC.
pub const RESEAL_META: u8 = 1;
/// Ask the harness to recompute the ring header's CRC.
pub const RESEAL_HEADER: u8 = 2;
/// Ask the harness to recompute the CRC of every record in the data area.
pub const RESEAL_RECORDS: u8 = 4;

/// Bytes of the control block an input carries: the static header and the
/// fence, head, commit and acknowledged-index lines.
pub const CONTROL_LINES_BYTES: usize = 5 * LINE_BYTES;

const META_AT: usize = 1;
const CONTROL_AT: usize = META_AT + META_BYTES;
const OFFSET_AT: usize = CONTROL_AT + CONTROL_LINES_BYTES;
const DATA_AT: usize = OFFSET_AT + 8;

/// A data directory, compactly:
///
/// ```text
/// offset  size  field
/// 0       1     flags: RESEAL_META | RESEAL_HEADER | RESEAL_RECORDS
/// 1       128   the metadata file
/// 129     320   control block bytes 0..320 (the rest is zero)
/// 449     8     physical offset of the data bytes (u64 LE, modulo the
///               capacity, rounded down to a line)
/// 457     ..    data-area bytes from that offset, wrapping at the end
/// ```
///
/// Shorter inputs are padded with zeroes; data beyond the capacity is
/// ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirInput {
    /// Which CRCs the harness recomputes.
    pub flags: u8,
    /// The metadata file.
    pub meta: [u8; META_BYTES],
    /// The first lines of the control block.
    pub control: [u8; CONTROL_LINES_BYTES],
    /// Where the data bytes go.
    pub data_offset: u64,
    /// Data-area bytes.
    pub data: Vec<u8>,
}

/// What [`DirInput::write_to`] laid out.
#[derive(Clone, Copy, Debug)]
pub struct Written {
    /// The capacity of the ring file written.
    pub capacity: u64,
    /// A configuration matching the ring header's ids and that capacity.
    pub config: RingConfig,
}

impl DirInput {
    /// Decodes an input (any bytes).
    pub fn parse(input: &[u8]) -> DirInput {
        let mut fixed = [0u8; DATA_AT];
        let n = input.len().min(DATA_AT);
        fixed[..n].copy_from_slice(&input[..n]);
        DirInput {
            flags: fixed[0],
            meta: fixed[META_AT..CONTROL_AT].try_into().expect("128 bytes"),
            control: fixed[CONTROL_AT..OFFSET_AT].try_into().expect("320 bytes"),
            data_offset: u64::from_le_bytes(fixed[OFFSET_AT..DATA_AT].try_into().expect("8")),
            data: input.get(DATA_AT..).unwrap_or_default().to_vec(),
        }
    }

    /// Encodes it back (the inverse of [`DirInput::parse`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(DATA_AT + self.data.len());
        out.push(self.flags);
        out.extend_from_slice(&self.meta);
        out.extend_from_slice(&self.control);
        out.extend_from_slice(&self.data_offset.to_le_bytes());
        out.extend_from_slice(&self.data);
        out
    }

    /// The capacity of the ring file this input makes: the header's, when
    /// it is a power of two from 1 MiB to [`MAX_FUZZ_CAPACITY`].
    pub fn capacity(&self) -> u64 {
        let claimed = le_u64(&self.control[16..]);
        if claimed.is_power_of_two() && (MIN_CAPACITY_BYTES..=MAX_FUZZ_CAPACITY).contains(&claimed)
        {
            claimed
        } else {
            MIN_CAPACITY_BYTES
        }
    }

    /// Writes the metadata and ring files into `dir` (replacing them),
    /// resealing the CRCs the flags ask for. The ring is written where a
    /// data directory of the layout before shared memory had it
    /// (`<dir>/ring`): `Wal::open` moves it into the ring dir, `check` reads
    /// it in place.
    pub fn write_to(&self, dir: &Path) -> Written {
        let capacity = self.capacity();
        let mut meta = self.meta;
        if self.flags & RESEAL_META != 0 {
            let crc = crc32fast::hash(&meta[..META_BYTES - 4]);
            meta[META_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
        }
        let mut ring = vec![0u8; CONTROL_BLOCK_BYTES + capacity as usize];
        ring[..CONTROL_LINES_BYTES].copy_from_slice(&self.control);
        if self.flags & RESEAL_HEADER != 0 {
            let crc = crc32fast::hash(&ring[..60]);
            ring[60..64].copy_from_slice(&crc.to_le_bytes());
        }
        let area = &mut ring[CONTROL_BLOCK_BYTES..];
        place_wrapping(area, self.data_offset, &self.data);
        if self.flags & RESEAL_RECORDS != 0 {
            reseal_records(area);
        }
        // What an earlier run left (a ring moved into the ring dir and the
        // record naming it) would be found before `<dir>/ring`.
        clear_dir(dir);
        fs::write(dir.join(META_FILE), meta).expect("write the metadata file");
        fs::write(dir.join(RING_FILE), &ring).expect("write the ring file");
        Written {
            capacity,
            config: RingConfig {
                capacity,
                max_record_bytes: 64 << 10,
                cluster_id: le_u64(&self.control[24..]),
                node_id: le_u64(&self.control[32..]),
                lock_memory: false,
            },
        }
    }

    /// Describes the data directory `dir` (a ring of at most
    /// [`MAX_FUZZ_CAPACITY`] bytes) as an input: the data bytes start at the
    /// purge point and stop one line after a clean log, or after the last
    /// non-zero line of a damaged one (so that the records beyond the break
    /// are kept).
    pub fn from_dir(dir: &Path, flags: u8) -> DirInput {
        let meta: [u8; META_BYTES] = fs::read(dir.join(META_FILE))
            .expect("read the metadata file")
            .try_into()
            .expect("a 128-byte metadata file");
        let ring =
            fs::read(ringraft_wal::ring_path(dir).expect("a ring")).expect("read the ring file");
        let area = &ring[CONTROL_BLOCK_BYTES..];
        let capacity = area.len() as u64;
        assert!(capacity <= MAX_FUZZ_CAPACITY, "a ring too large to fuzz");
        let purged = meta[32] & 8 != 0;
        let start = if purged { le_u64(&meta[72..]) } else { 0 } % capacity;
        let mut data = [&area[start as usize..], &area[..start as usize]].concat();
        let non_zero = data
            .chunks(LINE_BYTES)
            .rposition(|line| line.iter().any(|b| *b != 0))
            .map_or(0, |last| (last + 1) * LINE_BYTES);
        let used = match ringraft_wal::check(dir) {
            Ok(report) if report.damage == ringraft_wal::Damage::None => {
                (report.end_lsn - report.start_lsn) as usize + LINE_BYTES
            }
            _ => non_zero,
        };
        data.truncate(used);
        DirInput {
            flags,
            meta,
            control: ring[..CONTROL_LINES_BYTES].try_into().expect("320 bytes"),
            data_offset: start,
            data,
        }
    }
}

/// Copies `bytes` into `area` from physical `offset` (modulo the area,
/// rounded down to a line), wrapping at the end; at most one area's worth.
pub fn place_wrapping(area: &mut [u8], offset: u64, bytes: &[u8]) {
    let capacity = area.len();
    let start = (offset % capacity as u64) as usize / LINE_BYTES * LINE_BYTES;
    let bytes = &bytes[..bytes.len().min(capacity)];
    let first = bytes.len().min(capacity - start);
    area[start..start + first].copy_from_slice(&bytes[..first]);
    area[..bytes.len() - first].copy_from_slice(&bytes[first..]);
}

/// Recomputes the CRC of every line of `area` that starts with the record
/// magic and whose claimed payload fits in the area. From the end of the
/// area to its start, so that a header inside another record's payload is
/// resealed before that record's CRC covers it.
pub fn reseal_records(area: &mut [u8]) {
    for physical in (0..area.len()).step_by(LINE_BYTES).rev() {
        if area[physical..physical + 4] != RECORD_MAGIC.to_le_bytes() {
            continue;
        }
        let payload_len = le_u32(&area[physical + 8..]) as usize;
        let payload_start = physical + RECORD_HEADER_BYTES;
        if payload_len > area.len() - payload_start {
            continue;
        }
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&area[physical..physical + RECORD_CRC_OFFSET]);
        hasher.update(&area[payload_start..payload_start + payload_len]);
        let crc = hasher.finalize();
        area[physical + RECORD_CRC_OFFSET..payload_start].copy_from_slice(&crc.to_le_bytes());
    }
}

/// A remote writer's batch for the `adopt` target, compactly:
///
/// ```text
/// offset  size  field
/// 0       1     flags: bit 0 reseal record CRCs, bit 1 purge the local log
///               first (an anchored log), bit 2 claim a start one line past
///               the tail
/// 1       1     entries the ring appends locally first (low 4 bits)
/// 2       8     the writer's epoch (u64 LE); the fence is raised to it
/// 10      8     to_lsn - tail (u64 LE, saturating)
/// 18      8     entries the control message names (u64 LE)
/// 26      1     whether it names a last log id (bit 0)
/// 27      8     its term
/// 35      8     its index
/// 43      ..    bytes the writer put at the tail, wrapping at the end
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdoptInput {
    /// See the table.
    pub flags: u8,
    /// Entries appended locally before the remote write.
    pub local_entries: u8,
    /// The writer's epoch.
    pub epoch: u64,
    /// `to_lsn - tail`.
    pub span: u64,
    /// Entries named.
    pub entries: u64,
    /// Last log id named.
    pub last: Option<LogPos>,
    /// The bytes written at the tail.
    pub bytes: Vec<u8>,
}

/// Reseal record CRCs in an [`AdoptInput`]'s bytes.
pub const ADOPT_RESEAL: u8 = 1;
/// Purge the local log before the remote write.
pub const ADOPT_PURGE: u8 = 2;
/// Claim that the records start one line past the tail.
pub const ADOPT_OFF_TAIL: u8 = 4;
const ADOPT_FIXED: usize = 43;

impl AdoptInput {
    /// Decodes an input (any bytes).
    pub fn parse(input: &[u8]) -> AdoptInput {
        let mut fixed = [0u8; ADOPT_FIXED];
        let n = input.len().min(ADOPT_FIXED);
        fixed[..n].copy_from_slice(&input[..n]);
        AdoptInput {
            flags: fixed[0],
            local_entries: fixed[1] & 15,
            epoch: le_u64(&fixed[2..]),
            span: le_u64(&fixed[10..]),
            entries: le_u64(&fixed[18..]),
            last: (fixed[26] & 1 != 0).then(|| LogPos {
                term: le_u64(&fixed[27..]),
                index: le_u64(&fixed[35..]),
            }),
            bytes: input.get(ADOPT_FIXED..).unwrap_or_default().to_vec(),
        }
    }

    /// Encodes it back (the inverse of [`AdoptInput::parse`] for local
    /// entry counts below 16).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ADOPT_FIXED + self.bytes.len());
        out.push(self.flags);
        out.push(self.local_entries);
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&self.span.to_le_bytes());
        out.extend_from_slice(&self.entries.to_le_bytes());
        out.push(u8::from(self.last.is_some()));
        let last = self.last.unwrap_or(LogPos { term: 0, index: 0 });
        out.extend_from_slice(&last.term.to_le_bytes());
        out.extend_from_slice(&last.index.to_le_bytes());
        out.extend_from_slice(&self.bytes);
        out
    }
}

/// The ring configuration of the `adopt` target.
pub fn adopt_config() -> RingConfig {
    RingConfig {
        capacity: MIN_CAPACITY_BYTES,
        max_record_bytes: 64 << 10,
        cluster_id: 0xF022,
        node_id: 1,
        lock_memory: false,
    }
}

/// The epoch under which the `adopt` target appends its local entries.
pub const LOCAL_EPOCH: Epoch = Epoch(1 << 16 | 1);

/// Puts a fresh ring into the state an [`AdoptInput`] asks for before the
/// remote write: `local_entries` entries of term 1 appended under
/// [`LOCAL_EPOCH`], then, if asked, purged up to the one before last (so
/// that the log is anchored). The seed generator replays it to learn the
/// tail a real leader would write at.
pub fn adopt_setup(wal: &mut Wal, local_entries: u8, purge: bool) {
    let current = wal.ring().fence();
    wal.ring()
        .compare_exchange_fence(current, LOCAL_EPOCH)
        .expect("a fresh ring's fence is below the local epoch");
    for index in 0..u64::from(local_entries) {
        let payload = vec![index as u8; (index * 37 % 200) as usize];
        wal.ring_mut()
            .append(
                LOCAL_EPOCH,
                &[EntryRef {
                    term: 1,
                    index,
                    payload: &payload,
                }],
            )
            .expect("a local append to a fresh ring");
    }
    if purge && local_entries >= 2 {
        let upto = u64::from(local_entries) - 2;
        wal.purge(LogPos {
            term: 1,
            index: upto,
        })
        .expect("purge a local log");
    }
}

/// A data directory for this process's runs, `<scratch>/data`, whose ring
/// dir is `<scratch>/shm` ([`ring_dir_of`]); the scratch directory is in
/// /dev/shm when there is one (every run rewrites a megabyte and the wal
/// fsyncs it), removed at exit only if the process ends normally.
pub fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &DIR.get_or_init(|| {
        let shm = Path::new("/dev/shm");
        let parent = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let root = tempfile::Builder::new()
            .prefix("ringraft-wal-fuzz-")
            .tempdir_in(parent)
            .expect("a scratch directory");
        let data = root.path().join("data");
        fs::create_dir(&data).expect("a scratch data directory");
        (root, data)
    })
    .1
}

/// The ring dir of a fuzzed data directory: `shm` beside it.
pub fn ring_dir_of(dir: &Path) -> PathBuf {
    dir.parent()
        .expect("a data directory has a parent")
        .join("shm")
}

/// Empties `dir` (a scratch data directory) and its ring dir of the wal's
/// files and directories (the segment log is a directory, `log/`).
pub fn clear_dir(dir: &Path) {
    for d in [dir.to_path_buf(), ring_dir_of(dir)] {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for entry in entries {
            let path: PathBuf = entry.expect("a directory entry").path();
            if path.is_dir() {
                fs::remove_dir_all(&path).expect("remove a scratch directory");
            } else {
                fs::remove_file(&path).expect("remove a scratch file");
            }
        }
    }
}

fn le_u64(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"))
}

fn le_u32(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_round_trip() {
        let input = DirInput {
            flags: 7,
            meta: [3; META_BYTES],
            control: [5; CONTROL_LINES_BYTES],
            data_offset: 12345,
            data: vec![9; 1000],
        };
        assert_eq!(DirInput::parse(&input.to_bytes()), input);
        let adopt = AdoptInput {
            flags: 3,
            local_entries: 5,
            epoch: 2 << 16 | 2,
            span: 640,
            entries: 4,
            last: Some(LogPos { term: 2, index: 8 }),
            bytes: vec![1; 640],
        };
        assert_eq!(AdoptInput::parse(&adopt.to_bytes()), adopt);
    }

    #[test]
    fn placement_wraps() {
        let mut area = vec![0u8; 256];
        place_wrapping(&mut area, 192 + 7, &[1; 100]);
        assert!(area[192..].iter().all(|b| *b == 1));
        assert!(area[..36].iter().all(|b| *b == 1));
        assert!(area[36..192].iter().all(|b| *b == 0));
    }
}
