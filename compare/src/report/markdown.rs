//! The markdown document of a table: the side-by-side rows with their
//! ratios, failed operations, the physical floor and every round. Pure
//! formatting of a [`Table`]; it never reads a clock or a file, and never
//! computes a figure the table does not hold (ratios come from
//! [`Row::ratios`] and [`ratio`]).

use std::fmt::Write as _;

use super::{Durability, FloorSummary, Row, Summary, System, Table, ratio};

/// Where and how the table was made, shown above it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Meta {
    /// The command line that made the results.
    pub command: Option<String>,
    /// When (as given: the tool reads no clock).
    pub date: Option<String>,
    /// The machine (cores, filesystem of the data dirs, ...).
    pub machine: Option<String>,
    /// What the two systems were (versions, flags).
    pub systems: Option<String>,
}

/// A latency in ms with three significant digits or so (`0.925`, `17.8`,
/// `142`).
pub fn fmt_ms(ms: f64) -> String {
    if !ms.is_finite() || ms <= 0.0 {
        "–".into()
    } else if ms < 1.0 {
        format!("{ms:.3}")
    } else if ms < 10.0 {
        format!("{ms:.2}")
    } else if ms < 100.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.0}")
    }
}

/// A throughput with no decimals (one decimal below 100/s).
pub fn fmt_rate(per_s: f64) -> String {
    if !per_s.is_finite() || per_s <= 0.0 {
        "–".into()
    } else if per_s < 100.0 {
        format!("{per_s:.1}")
    } else {
        format!("{per_s:.0}")
    }
}

/// A ratio with two decimals (three below 0.1), or `–`.
pub fn fmt_ratio(r: Option<f64>) -> String {
    match r {
        Some(r) if r < 0.1 => format!("{r:.3}"),
        Some(r) => format!("{r:.2}"),
        None => "–".into(),
    }
}

/// A size as `64 B`, `4 KiB`, `1 MiB`, or bytes.
pub fn fmt_size(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

/// Renders rows of cells as a markdown table with padded columns
/// (readable in a terminal too); `right` says which columns are numbers.
fn markdown_table(header: &[&str], right: &[bool], rows: &[Vec<String>]) -> String {
    let width = |k: usize| {
        rows.iter()
            .map(|r| r[k].chars().count())
            .chain([header[k].chars().count(), 3])
            .max()
            .unwrap_or(3)
    };
    let widths: Vec<usize> = (0..header.len()).map(width).collect();
    let line = |cells: Vec<String>| {
        let mut s = String::from("|");
        for (k, c) in cells.iter().enumerate() {
            let pad = widths[k] - c.chars().count();
            if right[k] {
                let _ = write!(s, " {}{} |", " ".repeat(pad), c);
            } else {
                let _ = write!(s, " {}{} |", c, " ".repeat(pad));
            }
        }
        s.push('\n');
        s
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    out += &line(
        (0..header.len())
            .map(|k| {
                if right[k] {
                    format!("{}:", "-".repeat(widths[k] - 1))
                } else {
                    "-".repeat(widths[k])
                }
            })
            .collect(),
    );
    for r in rows {
        out += &line(r.clone());
    }
    out
}

fn side_cells(s: &Option<Summary>) -> [String; 4] {
    match s {
        Some(s) => [
            fmt_ms(s.p50_ms),
            fmt_ms(s.p99_ms),
            fmt_ms(s.p999_ms),
            fmt_rate(s.ops_per_s),
        ],
        None => ["–".into(), "–".into(), "–".into(), "–".into()],
    }
}

/// The whole markdown document.
pub fn render_markdown(table: &Table, meta: &Meta) -> String {
    let mut out = meta_lines(meta);
    out += "Latencies in ms per operation (one record appended, or one key put, and \
            acknowledged); throughput in operations/s. Ratios are ringraft ÷ etcd: a \
            latency ratio below 1 and a throughput ratio above 1 mean that ringraft is \
            better. Rows `fsync`: ringraft `--durability fsync` against etcd's default; \
            rows `memory`: ringraft `--durability memory` against etcd \
            `--unsafe-no-fsync`.\n\n";
    out += &side_by_side(&table.rows);
    out += &failed_operations(&table.rows);
    if let Some(f) = &table.floor {
        out += &floor_section(f, &table.rows);
    }
    out += "\nEvery round (ms, ops/s):\n\n";
    out += &every_round(table);
    out
}

/// Where and how the table was made (the lines the meta gives, then a
/// blank line), or nothing.
fn meta_lines(meta: &Meta) -> String {
    let mut out = String::new();
    if let Some(date) = &meta.date {
        let _ = writeln!(out, "Measured {date}.");
    }
    if let Some(machine) = &meta.machine {
        let _ = writeln!(out, "Machine: {machine}.");
    }
    if let Some(systems) = &meta.systems {
        let _ = writeln!(out, "Systems: {systems}.");
    }
    if let Some(command) = &meta.command {
        let _ = writeln!(out, "\n```sh\n{command}\n```");
    }
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

/// The side-by-side table: both systems' figures and their ratios, one
/// row per (durability, clients, record size).
fn side_by_side(rows: &[Row]) -> String {
    let header = [
        "durability",
        "clients",
        "record",
        "ringraft p50",
        "p99",
        "p999",
        "ops/s",
        "etcd p50",
        "p99",
        "p999",
        "ops/s",
        "p50 ÷",
        "p99 ÷",
        "p999 ÷",
        "ops/s ÷",
    ];
    let right = [
        false, true, true, true, true, true, true, true, true, true, true, true, true, true, true,
    ];
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            let ratios = row.ratios();
            let mut cells = vec![
                row.key.durability.to_string(),
                row.key.clients.to_string(),
                fmt_size(row.key.size_bytes),
            ];
            cells.extend(side_cells(&row.ringraft));
            cells.extend(side_cells(&row.etcd));
            cells.extend([
                fmt_ratio(ratios.p50),
                fmt_ratio(ratios.p99),
                fmt_ratio(ratios.p999),
                fmt_ratio(ratios.throughput),
            ]);
            cells
        })
        .collect();
    markdown_table(&header, &right, &rows)
}

/// The note naming the rows whose operations failed, or nothing.
fn failed_operations(rows: &[Row]) -> String {
    let failed: Vec<String> = rows
        .iter()
        .flat_map(|row| {
            [(System::Ringraft, &row.ringraft), (System::Etcd, &row.etcd)]
                .into_iter()
                .filter_map(move |(system, s)| match s {
                    Some(s) if s.errors > 0 => Some(format!(
                        "{system} {} {} clients {}: {} errors",
                        row.key.durability,
                        row.key.clients,
                        fmt_size(row.key.size_bytes),
                        s.errors
                    )),
                    _ => None,
                })
        })
        .collect();
    if failed.is_empty() {
        return String::new();
    }
    format!(
        "\n**Operations failed** (not counted in latency or throughput; see the per-round table): {}.\n",
        failed.join("; ")
    )
}

/// The physical floor measured in the same run, and the `fsync` 1-client
/// rows against one preallocated pwrite + fdatasync.
fn floor_section(f: &FloorSummary, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nPhysical floor, measured in the same run ({} round{}, in {}):\n",
        f.rounds,
        if f.rounds == 1 { "" } else { "s" },
        f.dirs.join(", ")
    );
    let floor_rows = vec![
        vec![
            "4 KiB pwrite + fdatasync, preallocated file".to_string(),
            fmt_ms(f.fdatasync.0),
            fmt_ms(f.fdatasync.1),
            f.fdatasync.2.to_string(),
        ],
        vec![
            "4 KiB pwrite + fdatasync, appending (file grows)".to_string(),
            fmt_ms(f.fdatasync_append.0),
            fmt_ms(f.fdatasync_append.1),
            f.fdatasync_append.2.to_string(),
        ],
        vec![
            "loopback TCP round trip, 64 B ping-pong".to_string(),
            fmt_ms(f.rtt.0),
            fmt_ms(f.rtt.1),
            f.rtt.2.to_string(),
        ],
    ];
    out += &markdown_table(
        &["floor", "p50 ms", "p99 ms", "samples"],
        &[false, true, true, true],
        &floor_rows,
    );
    let against: Vec<String> = rows
        .iter()
        .filter(|r| r.key.durability == Durability::Fsync && r.key.clients == 1)
        .filter_map(|r| {
            let s = r.ringraft.as_ref()?;
            Some(format!(
                "{} ringraft {}, etcd {}",
                fmt_size(r.key.size_bytes),
                fmt_ratio(ratio(s.p50_ms, f.fdatasync.0)),
                fmt_ratio(r.etcd.as_ref().and_then(|e| ratio(e.p50_ms, f.fdatasync.0))),
            ))
        })
        .collect();
    if !against.is_empty() {
        let _ = writeln!(
            out,
            "\n`fsync`, 1 client, p50 ÷ one preallocated pwrite + fdatasync (p50): {}.",
            against.join("; ")
        );
    }
    out
}

/// Every round on its own (the spread behind the merged rows).
fn every_round(table: &Table) -> String {
    let round_rows: Vec<Vec<String>> = table
        .runs
        .iter()
        .map(|(r, s)| {
            vec![
                r.durability.to_string(),
                r.clients.to_string(),
                fmt_size(r.size_bytes),
                r.system.to_string(),
                r.round.to_string(),
                fmt_ms(s.p50_ms),
                fmt_ms(s.p99_ms),
                fmt_ms(s.p999_ms),
                fmt_rate(s.ops_per_s),
                s.errors.to_string(),
            ]
        })
        .collect();
    markdown_table(
        &[
            "durability",
            "clients",
            "record",
            "system",
            "round",
            "p50",
            "p99",
            "p999",
            "ops/s",
            "errors",
        ],
        &[false, true, true, false, true, true, true, true, true, true],
        &round_rows,
    )
}
