//! Scanning a segment directory at open and for the offline checker:
//! listing the files, reading them whole, finding where the log ends and
//! what damage lies beyond. It must never write, truncate or remove a file
//! (`open` decides what to discard).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use crate::disk::{Access, Disk, DiskFile};
use crate::error::{Result, WalError};
use crate::layout::LINE_BYTES;
use crate::recovery::{Damage, Evidence};
use crate::segment::{
    MAX_SEGMENT_FILE_BYTES, SEGMENT_HEADER_BYTES, SegmentDefect, SegmentHeader, parse_segment_name,
    scan_records, well_formed_beyond,
};
use crate::validate::{ChainTip, LogPos};

use super::*;

/// Lists the segment files of `dir`, in log order.
pub(super) fn list_segments<D: Disk>(disk: &D, dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut segments: Vec<(u64, PathBuf)> = disk
        .list(dir)?
        .into_iter()
        .filter_map(|name| parse_segment_name(&name).map(|first| (first, dir.join(name))))
        .collect();
    segments.sort_by_key(|(first, _)| *first);
    Ok(segments)
}

pub(super) fn read_whole<F: DiskFile>(file: &F) -> Result<Vec<u8>> {
    let len = file.size()?;
    if len > MAX_SEGMENT_FILE_BYTES {
        return Err(WalError::Inconsistent {
            path: file.path().to_path_buf(),
            what: format!(
                "segment file of {len} bytes, above the largest a segment can be ({MAX_SEGMENT_FILE_BYTES})"
            ),
        });
    }
    let mut buf = vec![0u8; len as usize];
    let read = file.read_at(&mut buf, 0)?;
    buf.truncate(read);
    Ok(buf)
}

/// Scans the segments of `dir` (module docs, "Recovery"), opening files
/// with `access`. Changes nothing.
pub(super) fn scan_dir<D: Disk>(
    disk: &D,
    dir: &Path,
    cluster_id: u64,
    node_id: u64,
    acked: Option<u64>,
    access: Access,
) -> Result<DirScan<D::File>> {
    let files = list_segments(disk, dir)?;
    let mut kept: Vec<Scanned<D::File>> = Vec::new();
    let mut tip = ChainTip::after(None);
    let mut lsn_end = 0u64;
    let mut stop: Option<(usize, u64, SegmentDefect)> = None;
    for (k, (name_index, path)) in files.iter().enumerate() {
        let file = disk.open(path, access)?;
        let buf = read_whole(&file)?;
        let defect_at = |offset: u64, reason: SegmentDefect| (k, offset, reason);
        let header = match SegmentHeader::decode(&buf) {
            Ok(header) => header,
            Err(fault) => {
                stop = Some(defect_at(0, SegmentDefect::Header(fault)));
                break;
            }
        };
        for (field, expected, found) in [
            ("cluster id", cluster_id, header.cluster_id),
            ("node id", node_id, header.node_id),
        ] {
            if expected != found {
                return Err(WalError::Foreign {
                    path: path.clone(),
                    field,
                    expected,
                    found,
                });
            }
        }
        if header.first_index != *name_index {
            stop = Some(defect_at(
                0,
                SegmentDefect::NameMismatch {
                    name: *name_index,
                    header: header.first_index,
                },
            ));
            break;
        }
        if !tip.unanchored
            && (header.first_index != tip.next_index || header.prev_term != tip.last_term)
        {
            stop = Some(defect_at(
                0,
                SegmentDefect::NotContinuing {
                    expected_index: tip.next_index,
                    expected_term: tip.last_term,
                    first_index: header.first_index,
                    prev_term: header.prev_term,
                },
            ));
            break;
        }
        let anchored = ChainTip {
            next_index: header.first_index,
            last_term: header.prev_term,
            epoch: tip.epoch,
            unanchored: false,
        };
        let scan = scan_records(&buf, SEGMENT_HEADER_BYTES as u64, anchored, lsn_end);
        let file_len = buf.len() as u64;
        let end_of_data = scan.stop.is_end_of_data();
        let garbage_after_end = buf[scan.end as usize..].iter().any(|b| *b != 0);
        tip = scan.tip;
        lsn_end = scan.lsn_end;
        kept.push(Scanned {
            segment: Segment {
                first_index: header.first_index,
                path: path.clone(),
                file: Arc::new(file),
                offsets: scan.offsets,
                terms: scan.terms,
                end: scan.end,
                file_len,
                written_at: std::fs::metadata(path)
                    .and_then(|m| m.modified())
                    .unwrap_or_else(|_| SystemTime::now()),
            },
            tip,
            lsn_end,
            garbage_after_end,
        });
        let is_last = k + 1 == files.len();
        if !end_of_data || (is_last && garbage_after_end) {
            // A break, or (as the ring's scan reports it) where the data
            // ends with something other than zeroes after it.
            stop = Some(defect_at(scan.end, scan.stop));
            break;
        }
    }
    // kept[i] is files[i]: the files after the last kept one are beyond
    // the log.
    let mut beyond_start = match &stop {
        Some((k, _, _)) if *k < kept.len() => k + 1,
        Some((k, _, _)) => *k,
        None => files.len(),
    };
    // An empty segment at the end (created, nothing written yet) is not
    // part of the log.
    if kept
        .last()
        .is_some_and(|last| last.segment.offsets.is_empty())
    {
        kept.pop();
        beyond_start = kept.len();
    }
    let beyond: Vec<(u64, PathBuf)> = files[beyond_start..].to_vec();

    let tip = kept.last().map_or(ChainTip::after(None), |s| s.tip);
    // The verdict.
    let mut damage = Damage::None;
    if let Some(acked) = acked
        && (tip.unanchored || tip.next_index <= acked)
    {
        damage = Damage::CorruptInside(Evidence::BelowWatermark {
            acked,
            recovered_next_index: if tip.unanchored { 0 } else { tip.next_index },
        });
    }
    let stop = stop.map(|(k, offset, reason)| SegmentStop {
        path: files[k].1.clone(),
        segment_first_index: files[k].0,
        offset,
        reason,
    });
    // Where the log's data ends: in the last kept segment, after its last
    // record (past the record that breaks there, if one does).
    let end_of_log = kept.last().map(|last| {
        let broken_here = stop
            .as_ref()
            .is_some_and(|stop| stop.path == last.segment.path && !stop.reason.is_end_of_data());
        let from = last.segment.end + if broken_here { LINE_BYTES as u64 } else { 0 };
        (last.segment.path.clone(), from)
    });
    let cut_last = kept.last().is_some_and(|last| {
        last.garbage_after_end
            || stop
                .as_ref()
                .is_some_and(|stop| stop.path == last.segment.path)
    });
    if damage == Damage::None
        && let Some(stop) = &stop
    {
        // Look for a well-formed record anywhere past the log's end: in the
        // rest of the last kept segment, then in every file beyond it.
        let mut evidence = None;
        if let Some((path, from)) = &end_of_log {
            let buf = read_whole(&disk.open(path, Access::ReadOnly)?)?;
            evidence = well_formed_beyond(&buf, *from, tip);
        }
        for (_, path) in &beyond {
            if evidence.is_some() {
                break;
            }
            let buf = read_whole(&disk.open(path, Access::ReadOnly)?)?;
            evidence = well_formed_beyond(&buf, SEGMENT_HEADER_BYTES as u64, tip);
        }
        damage = match evidence {
            Some(beyond) => Damage::CorruptInside(Evidence::WellFormedBeyond {
                lsn: beyond.lsn,
                index: beyond.index,
                epoch: beyond.epoch,
            }),
            None if stop.reason.is_end_of_data() => Damage::None,
            None => Damage::TornTail,
        };
    }
    Ok(DirScan {
        kept,
        beyond,
        stop,
        damage,
        cut_last,
    })
}

/// Checks the segments of `dir` without changing a byte (the offline
/// checker's view of [`SegmentLog::open`]).
///
/// # Errors
/// [`WalError::Foreign`] when a segment belongs to another cluster or node;
/// [`WalError::Inconsistent`] for a file too large to be a segment;
/// [`WalError::Io`].
pub fn check_segments<D: Disk>(
    disk: &D,
    dir: &Path,
    cluster_id: u64,
    node_id: u64,
    acked: Option<u64>,
) -> Result<SegmentRecovery> {
    let scan = scan_dir(disk, dir, cluster_id, node_id, acked, Access::ReadOnly)?;
    Ok(recovery_of(&scan.kept, scan.stop, scan.damage, acked, 0, 0))
}

pub(super) fn recovery_of<F>(
    kept: &[Scanned<F>],
    stop: Option<SegmentStop>,
    damage: Damage,
    acked: Option<u64>,
    cut_bytes: u64,
    removed_files: u64,
) -> SegmentRecovery {
    let entries: u64 = kept.iter().map(|s| s.segment.offsets.len() as u64).sum();
    let last = kept.last().and_then(|s| {
        let index = s.tip.next_index.checked_sub(1)?;
        (!s.tip.unanchored).then_some(LogPos {
            index,
            term: s.tip.last_term,
        })
    });
    SegmentRecovery {
        segments: kept.len() as u64,
        first_index: kept.first().map_or(0, |s| s.segment.first_index),
        last: if entries == 0 { None } else { last },
        entries,
        disk_bytes: kept.iter().map(|s| s.segment.file_len).sum(),
        acked,
        stop,
        damage,
        cut_bytes,
        removed_files,
    }
}
