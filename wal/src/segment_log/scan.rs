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

/// Where the scan of the listing stopped: the file's position in the
/// listing, the offset in that file, and why.
type ListingStop = (usize, u64, SegmentDefect);

/// The segments a scan kept, and where it stopped if it did.
type ChainScan<F> = (Vec<Scanned<F>>, Option<ListingStop>);

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
    let (mut kept, stop) = scan_chain(disk, &files, cluster_id, node_id, access)?;
    let beyond_start = beyond_start(&mut kept, &stop, files.len());
    let beyond: Vec<(u64, PathBuf)> = files[beyond_start..].to_vec();

    let tip = kept.last().map_or(ChainTip::after(None), |s| s.tip);
    // The verdict.
    let mut damage = below_watermark(acked, tip);
    let stop = stop.map(|(k, offset, reason)| SegmentStop {
        path: files[k].1.clone(),
        segment_first_index: files[k].0,
        offset,
        reason,
    });
    let end_of_log = end_of_log(&kept, stop.as_ref());
    let cut_last = kept.last().is_some_and(|last| {
        last.garbage_after_end
            || stop
                .as_ref()
                .is_some_and(|stop| stop.path == last.segment.path)
    });
    if damage == Damage::None
        && let Some(stop) = &stop
    {
        damage = damage_past_end(disk, stop, end_of_log.as_ref(), &beyond, tip)?;
    }
    Ok(DirScan {
        kept,
        beyond,
        stop,
        damage,
        cut_last,
    })
}

/// Scans the listed segment files in order while they continue the chain;
/// returns the segments kept and where (and why) the scan stopped, if it
/// did before the end of the listing.
fn scan_chain<D: Disk>(
    disk: &D,
    files: &[(u64, PathBuf)],
    cluster_id: u64,
    node_id: u64,
    access: Access,
) -> Result<ChainScan<D::File>> {
    let mut kept: Vec<Scanned<D::File>> = Vec::new();
    let mut tip = ChainTip::after(None);
    let mut lsn_end = 0u64;
    for (k, (name_index, path)) in files.iter().enumerate() {
        let file = disk.open(path, access)?;
        let buf = read_whole(&file)?;
        let header = match SegmentHeader::decode(&buf) {
            Ok(header) => header,
            Err(fault) => return Ok((kept, Some((k, 0, SegmentDefect::Header(fault))))),
        };
        if let Some(defect) = header_defect(&header, path, *name_index, tip, cluster_id, node_id)? {
            return Ok((kept, Some((k, 0, defect))));
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
        let (end, reason) = (scan.end, scan.stop);
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
            return Ok((kept, Some((k, end, reason))));
        }
    }
    Ok((kept, None))
}

/// Checks a segment's header against the node, its file name and the
/// chain so far (`tip`): a segment of another cluster or node is an error,
/// one that does not fit its name or the chain is where the log stops.
fn header_defect(
    header: &SegmentHeader,
    path: &Path,
    name_index: u64,
    tip: ChainTip,
    cluster_id: u64,
    node_id: u64,
) -> Result<Option<SegmentDefect>> {
    WalError::check_owner(
        path,
        &[
            ("cluster id", cluster_id, header.cluster_id),
            ("node id", node_id, header.node_id),
        ],
    )?;
    if header.first_index != name_index {
        return Ok(Some(SegmentDefect::NameMismatch {
            name: name_index,
            header: header.first_index,
        }));
    }
    if !tip.unanchored
        && (header.first_index != tip.next_index || header.prev_term != tip.last_term)
    {
        return Ok(Some(SegmentDefect::NotContinuing {
            expected_index: tip.next_index,
            expected_term: tip.last_term,
            first_index: header.first_index,
            prev_term: header.prev_term,
        }));
    }
    Ok(None)
}

/// Where in the listing the files beyond the log start, dropping from
/// `kept` an empty last segment (created, nothing written yet), which is
/// not part of the log.
fn beyond_start<F>(
    kept: &mut Vec<Scanned<F>>,
    stop: &Option<ListingStop>,
    file_count: usize,
) -> usize {
    // kept[i] is files[i]: the files after the last kept one are beyond
    // the log.
    let mut beyond_start = match stop {
        Some((k, _, _)) if *k < kept.len() => k + 1,
        Some((k, _, _)) => *k,
        None => file_count,
    };
    if kept
        .last()
        .is_some_and(|last| last.segment.offsets.is_empty())
    {
        kept.pop();
        beyond_start = kept.len();
    }
    beyond_start
}

/// The damage when the recovered log ends at or below the acknowledged
/// watermark `acked`; [`Damage::None`] otherwise.
fn below_watermark(acked: Option<u64>, tip: ChainTip) -> Damage {
    if let Some(acked) = acked
        && (tip.unanchored || tip.next_index <= acked)
    {
        return Damage::CorruptInside(Evidence::BelowWatermark {
            acked,
            recovered_next_index: if tip.unanchored { 0 } else { tip.next_index },
        });
    }
    Damage::None
}

/// Where the log's data ends: in the last kept segment, after its last
/// record (past the record that breaks there, if one does).
fn end_of_log<F>(kept: &[Scanned<F>], stop: Option<&SegmentStop>) -> Option<(PathBuf, u64)> {
    kept.last().map(|last| {
        let broken_here = stop
            .is_some_and(|stop| stop.path == last.segment.path && !stop.reason.is_end_of_data());
        let from = last.segment.end + if broken_here { LINE_BYTES as u64 } else { 0 };
        (last.segment.path.clone(), from)
    })
}

/// The damage when the log stops at `stop`: corrupt inside if a
/// well-formed record lies anywhere past the log's end (in the rest of the
/// last kept segment, then in every file beyond it), else none at a clean
/// end of data, else a torn tail.
fn damage_past_end<D: Disk>(
    disk: &D,
    stop: &SegmentStop,
    end_of_log: Option<&(PathBuf, u64)>,
    beyond: &[(u64, PathBuf)],
    tip: ChainTip,
) -> Result<Damage> {
    let mut evidence = None;
    if let Some((path, from)) = end_of_log {
        let buf = read_whole(&disk.open(path, Access::ReadOnly)?)?;
        evidence = well_formed_beyond(&buf, *from, tip);
    }
    for (_, path) in beyond {
        if evidence.is_some() {
            break;
        }
        let buf = read_whole(&disk.open(path, Access::ReadOnly)?)?;
        evidence = well_formed_beyond(&buf, SEGMENT_HEADER_BYTES as u64, tip);
    }
    Ok(match evidence {
        Some(beyond) => Damage::CorruptInside(Evidence::WellFormedBeyond {
            lsn: beyond.lsn,
            index: beyond.index,
            epoch: beyond.epoch,
        }),
        None if stop.reason.is_end_of_data() => Damage::None,
        None => Damage::TornTail,
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
