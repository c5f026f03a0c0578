//! Reading the segments: ranges, single records and runs read with one
//! pread each, the retention point, and the decoding and checking of a
//! record read back. It must never write, truncate or remove a file.

use std::sync::Arc;
use std::time::SystemTime;

use crate::disk::{Disk, DiskFile};
use crate::error::{Result, WalError};
use crate::record::{RECORD_HEADER_BYTES, RecordHeader, RecordKind, record_crc};

use super::*;

impl<D: Disk> SegmentReader<D> {
    /// The retained range: `(first index, one past the last index)`.
    pub fn range(&self) -> (u64, u64) {
        let shared = read_lock(&self.shared);
        (shared.first_index(), shared.next_index())
    }

    /// Where retention would start the log: the lowest index such that
    /// the records from it on take at most `max_bytes` (exact to the
    /// record), and past every segment but the last that was last written
    /// before `written_before` (whole segments, like Kafka's
    /// `retention.ms`). `None` sets no limit. Never past the end of the
    /// log; the first index when nothing needs to go.
    pub fn retention_point(
        &self,
        max_bytes: Option<u64>,
        written_before: Option<SystemTime>,
    ) -> u64 {
        let shared = read_lock(&self.shared);
        let mut point = shared.first_index();
        if let Some(max) = max_bytes {
            let mut kept = 0u64;
            for segment in shared.segments.iter().rev() {
                let Some(&start) = segment.offsets.first() else {
                    continue;
                };
                let bytes = segment.end - start as u64;
                if kept + bytes <= max {
                    kept += bytes;
                    continue;
                }
                let j = segment
                    .offsets
                    .partition_point(|&o| kept + (segment.end - o as u64) > max);
                point = point.max(segment.first_index + j as u64);
                break;
            }
        }
        if let Some(before) = written_before {
            let closed = shared.segments.len().saturating_sub(1);
            for segment in shared.segments.iter().take(closed) {
                if segment.written_at < before {
                    point = point.max(segment.next_index());
                }
            }
        }
        point
    }

    /// Bytes of the records from `index` to the end of the log (`None`
    /// when the segments do not hold `index`).
    pub fn bytes_from(&self, index: u64) -> Option<u64> {
        let shared = read_lock(&self.shared);
        let i = shared.find(index)?;
        let in_first = shared.segments[i].end - shared.segments[i].record_range(index).0;
        let rest: u64 = shared
            .segments
            .iter()
            .skip(i + 1)
            .map(|s| s.offsets.first().map_or(0, |&o| s.end - o as u64))
            .sum();
        Some(in_first + rest)
    }

    /// Bytes of the segment files (preallocated space included).
    pub fn disk_bytes(&self) -> u64 {
        read_lock(&self.shared)
            .segments
            .iter()
            .map(|s| s.file_len)
            .sum()
    }

    /// The term of entry `index`, when the log holds it.
    pub fn term_of(&self, index: u64) -> Option<u64> {
        let shared = read_lock(&self.shared);
        let i = shared.find(index)?;
        Some(shared.segments[i].term_of(index))
    }

    /// Reads entry `index`, checking its record (CRC, index).
    ///
    /// # Errors
    /// [`WalError::Trimmed`] below the first retained index,
    /// [`WalError::NotInLog`] beyond the last (both name the retained
    /// range); [`WalError::Corrupt`] when the record on disk fails its
    /// checks; [`WalError::Io`].
    pub fn read(&self, index: u64) -> Result<SegmentRecord> {
        let mut records = self.read_range(index, index.saturating_add(1), 0)?;
        Ok(records
            .pop()
            .expect("a read of one index in range gives one record"))
    }

    /// Reads the entries `from..to` (`to` is cut to the end of the log),
    /// stopping once `max_bytes` of records were read (at least one record
    /// is read when `from < to`): one pread per segment touched.
    ///
    /// # Errors
    /// As [`SegmentReader::read`], for `from`; an empty range is fine.
    pub fn read_range(&self, from: u64, to: u64, max_bytes: u64) -> Result<Vec<SegmentRecord>> {
        let runs = {
            if from >= to {
                return Ok(Vec::new());
            }
            let shared = read_lock(&self.shared);
            let Some(mut i) = shared.find(from) else {
                return Err(shared.out_of_range(from));
            };
            let to = to.min(shared.next_index());
            let mut runs = Vec::new();
            let mut index = from;
            let mut bytes = 0u64;
            while index < to && (bytes == 0 || bytes < max_bytes) {
                let segment = &shared.segments[i];
                let last = to.min(segment.next_index());
                let start = segment.record_range(index).0;
                let mut offsets = Vec::new();
                let mut end = start;
                while index < last && (bytes == 0 || bytes < max_bytes) {
                    let (s, e) = segment.record_range(index);
                    offsets.push(s - start);
                    bytes += e - s;
                    end = e;
                    index += 1;
                }
                runs.push(Run {
                    file: Arc::clone(&segment.file),
                    first_index: index - offsets.len() as u64,
                    start,
                    end,
                    offsets,
                });
                i += 1;
            }
            runs
        };
        let mut records = Vec::new();
        for run in runs {
            let len = usize::try_from(run.end - run.start).expect("a segment fits in memory");
            let mut buf = vec![0u8; len];
            let read = run.file.read_at(&mut buf, run.start)?;
            for (k, offset) in run.offsets.iter().enumerate() {
                let index = run.first_index + k as u64;
                match decode_owned(&buf[..read], *offset as usize, index) {
                    Ok(record) => records.push(record),
                    Err(detail) => return Err(self.read_failed(index, &run.file, detail)),
                }
            }
        }
        Ok(records)
    }

    /// A record that failed its checks: gone by a truncation or retention
    /// since its position was taken (a range error), or corrupt on disk.
    pub(super) fn read_failed(&self, index: u64, file: &Arc<D::File>, detail: String) -> WalError {
        let shared = read_lock(&self.shared);
        match shared.find(index) {
            Some(i) if Arc::ptr_eq(&shared.segments[i].file, file) => {
                let segment = &shared.segments[i];
                WalError::Corrupt {
                    index,
                    lsn: 0,
                    detail: format!(
                        "{} at offset {}: {detail}",
                        segment.path.display(),
                        segment.record_range(index).0
                    ),
                }
            }
            _ => shared.out_of_range(index),
        }
    }
}

/// Decodes and checks the record of `index` at `offset` of `buf`.
pub(super) fn decode_owned(
    buf: &[u8],
    offset: usize,
    index: u64,
) -> std::result::Result<SegmentRecord, String> {
    let header_bytes: &[u8; RECORD_HEADER_BYTES] = buf
        .get(offset..offset + RECORD_HEADER_BYTES)
        .ok_or("the file ends inside the record's header")?
        .try_into()
        .expect("64 bytes");
    let header = RecordHeader::decode(header_bytes).map_err(|d| format!("bad header: {d:?}"))?;
    let payload_len = header.payload_len as usize;
    let payload = buf
        .get(offset + RECORD_HEADER_BYTES..offset + RECORD_HEADER_BYTES + payload_len)
        .ok_or("the file ends inside the record's payload")?;
    let computed = record_crc(header_bytes, payload);
    if computed != header.crc {
        return Err(format!(
            "CRC mismatch: stored {:#010x}, computed {computed:#010x}",
            header.crc
        ));
    }
    if header.kind != RecordKind::Entry || header.index != index {
        return Err(format!(
            "holds a {:?} of index {}, the log says entry {index}",
            header.kind, header.index
        ));
    }
    Ok(SegmentRecord {
        index,
        term: header.term,
        lsn: header.lsn,
        epoch: header.epoch,
        payload: payload.to_vec(),
    })
}
