// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The output convention shared by every suite: a markdown table on stdout
//! and `<out-dir>/<suite>.json` shaped as
//! `{"suite": "...", "metrics": {"name": number, ...}, "notes": "..."}`.

use std::error::Error;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::suites::Suite;

/// Alternating repetitions per comparison when `--reps` is not given.
pub const DEFAULT_REPS: usize = 5;

/// What a suite returns.
pub type SuiteResult = Result<SuiteReport, Box<dyn Error>>;

/// Run-wide settings handed to every suite.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// Small sizes and a single repetition.
    pub quick: bool,
    reps: usize,
    out_dir: PathBuf,
    parts: Vec<String>,
}

impl Ctx {
    /// Settings for one invocation; `out_dir` defaults to `<target>/bench`.
    pub fn new(quick: bool, reps: usize, out_dir: Option<PathBuf>) -> Self {
        let out_dir = out_dir.unwrap_or_else(|| target_dir().join("bench"));
        Ctx {
            quick,
            reps: if quick { 1 } else { reps.max(1) },
            out_dir,
            parts: Vec::new(),
        }
    }

    /// Restricts the suites that have parts to the named ones (all of
    /// them when `parts` is empty): `--part`, for A/B runs of one part.
    pub fn with_parts(mut self, parts: Vec<String>) -> Self {
        self.parts = parts;
        self
    }

    /// Whether the part `name` of a suite runs in this invocation.
    pub fn runs_part(&self, name: &str) -> bool {
        self.parts.is_empty() || self.parts.iter().any(|p| p == name)
    }

    /// Repetitions for each side of an alternating comparison.
    pub fn reps(&self) -> usize {
        self.reps
    }

    /// Where JSON (and quick-mode report) files go.
    pub fn out_dir(&self) -> &std::path::Path {
        &self.out_dir
    }

    /// Picks the full-size or the quick-mode value of a parameter.
    pub fn pick<T>(&self, full: T, quick: T) -> T {
        if self.quick {
            quick
        } else {
            full
        }
    }
}

/// The workspace root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(PathBuf::from)
        .unwrap_or(manifest_dir)
}

/// `$CARGO_TARGET_DIR`, or `target/` at the workspace root.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// A markdown table beyond the metric list (for example one row per msize).
#[derive(Debug, Clone)]
pub struct Table {
    title: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with a title and column names.
    pub fn new(title: &str, header: &[&str]) -> Self {
        Table {
            title: title.to_string(),
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row; it must have one cell per column.
    pub fn row<S: ToString>(&mut self, cells: &[S]) -> &mut Self {
        assert_eq!(
            cells.len(),
            self.header.len(),
            "row width in {}",
            self.title
        );
        self.rows
            .push(cells.iter().map(|c| c.to_string()).collect());
        self
    }

    /// The table as GitHub-flavoured markdown.
    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        if !self.title.is_empty() {
            let _ = writeln!(out, "**{}**\n", self.title);
        }
        let _ = writeln!(out, "| {} |", self.header.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(self.header.len()));
        for row in &self.rows {
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        out
    }
}

/// One line of a plot: a label and its (x, y) points.
#[derive(Debug, Clone)]
pub struct Series {
    /// Which plot it belongs to (see `plots::PLOTS`).
    pub plot: String,
    /// Legend label, for example "ours" or "QEMU".
    pub label: String,
    /// The points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// Metrics, notes and extra tables produced by one suite run.
#[derive(Debug, Clone, Default)]
pub struct SuiteReport {
    metrics: Vec<(String, f64)>,
    notes: Vec<String>,
    tables: Vec<Table>,
    series: Vec<Series>,
}

impl SuiteReport {
    /// Records a named figure. Names are `snake_case` with their unit in the name.
    pub fn metric(&mut self, name: &str, value: f64) -> &mut Self {
        self.metrics.push((name.to_string(), value));
        self
    }

    /// Adds a free-text note (peer missing, sizes used, ...).
    pub fn note(&mut self, note: impl Into<String>) -> &mut Self {
        self.notes.push(note.into());
        self
    }

    /// Adds a table printed after the metric list.
    pub fn table(&mut self, table: Table) -> &mut Self {
        self.tables.push(table);
        self
    }

    /// Adds a line to one of the report's plots (`plots::PLOTS` names them).
    #[allow(dead_code)] // Used by the suites that feed plots.
    pub fn series(&mut self, plot: &str, label: &str, points: Vec<(f64, f64)>) -> &mut Self {
        self.series.push(Series {
            plot: plot.to_string(),
            label: label.to_string(),
            points,
        });
        self
    }

    /// The recorded metrics, in insertion order.
    pub fn metrics(&self) -> &[(String, f64)] {
        &self.metrics
    }

    /// The recorded plot lines.
    pub fn all_series(&self) -> &[Series] {
        &self.series
    }

    fn to_json(&self, suite: &str) -> serde_json::Value {
        let metrics: serde_json::Map<String, serde_json::Value> = self
            .metrics
            .iter()
            .map(|(name, value)| {
                let v = serde_json::Number::from_f64(*value)
                    .map(serde_json::Value::Number)
                    .unwrap_or(serde_json::Value::Null);
                (name.clone(), v)
            })
            .collect();
        let mut json = serde_json::json!({
            "suite": suite,
            "metrics": metrics,
            "notes": self.notes.join(" "),
        });
        if !self.series.is_empty() {
            let series: Vec<serde_json::Value> = self
                .series
                .iter()
                .map(|s| serde_json::json!({"plot": s.plot, "label": s.label, "points": s.points}))
                .collect();
            json["series"] = serde_json::Value::Array(series);
        }
        json
    }

    /// Metric list, extra tables and notes as markdown.
    pub fn to_markdown(&self, suite: &str) -> String {
        let mut metrics = Table::new(&format!("suite `{suite}`"), &["metric", "value"]);
        for (name, value) in &self.metrics {
            metrics.row(&[name.clone(), format_value(*value)]);
        }
        let mut out = metrics.to_markdown();
        for table in &self.tables {
            out.push('\n');
            out.push_str(&table.to_markdown());
        }
        for note in &self.notes {
            let _ = write!(out, "\n> {note}\n");
        }
        out
    }
}

/// Three significant digits for readability; JSON keeps the full value.
pub fn format_value(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let magnitude = v.abs().log10().floor() as i32;
    let decimals = (2 - magnitude).max(0) as usize;
    format!("{v:.decimals$}")
}

/// The median of a sample (the mean of the middle two for even sizes).
pub fn median(samples: &[f64]) -> f64 {
    assert!(!samples.is_empty(), "median of an empty sample");
    let mut sorted = samples.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let mid = sorted.len() / 2;
    if sorted.len().is_multiple_of(2) {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    } else {
        sorted[mid]
    }
}

/// Runs each contender once per round, `reps` rounds, in turn (A B C A B C ...),
/// so that machine noise hits all of them alike, and returns each median.
/// A contender returns its own figure for one run (a time, a rate, ...).
pub fn alternate<const N: usize>(
    reps: usize,
    contenders: &mut [&mut dyn FnMut() -> Result<f64, Box<dyn Error>>; N],
) -> Result<[f64; N], Box<dyn Error>> {
    let mut samples: [Vec<f64>; N] = std::array::from_fn(|_| Vec::with_capacity(reps));
    for _ in 0..reps.max(1) {
        for (i, run) in contenders.iter_mut().enumerate() {
            samples[i].push(run()?);
        }
    }
    Ok(std::array::from_fn(|i| median(&samples[i])))
}

/// Wall-clock time of one call.
pub fn time<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed())
}

/// Maps `len` bytes of the file `fd` from `offset` read-only, with
/// `MAP_POPULATE` (no page faults while `f` reads it), runs `f` on them and
/// unmaps: a copy from the page cache done in user space.
///
/// # Safety
///
/// Nothing may write or truncate the file while it is mapped.
pub unsafe fn with_file_mapped<R>(
    fd: std::os::fd::RawFd,
    len: usize,
    offset: u64,
    f: impl FnOnce(&[u8]) -> R,
) -> std::io::Result<R> {
    // SAFETY: a new shared read-only mapping; the result is checked below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd,
            offset as libc::off_t,
        )
    };
    if map == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `map` is `len` readable bytes until the munmap below, and the
    // caller keeps the file unchanged meanwhile; the slice does not outlive
    // this call.
    let out = f(unsafe { std::slice::from_raw_parts(map.cast::<u8>(), len) });
    // SAFETY: unmaps exactly the mapping made above.
    unsafe { libc::munmap(map, len) };
    Ok(out)
}

/// Runs one suite, prints its table and writes its JSON file.
pub fn run_suite(ctx: &Ctx, suite: &Suite) -> Result<SuiteReport, Box<dyn Error>> {
    eprintln!(
        "== suite {} ({})",
        suite.name,
        if ctx.quick { "quick" } else { "full" }
    );
    let report = (suite.run)(ctx)?;
    println!("{}", report.to_markdown(suite.name));
    std::fs::create_dir_all(&ctx.out_dir)?;
    let path = ctx.out_dir.join(format!("{}.json", suite.name));
    let json = serde_json::to_string_pretty(&report.to_json(suite.name))?;
    std::fs::write(&path, json + "\n")?;
    eprintln!("== wrote {}", path.display());
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_median_odd_and_even() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn test_alternate_interleaves_contenders() {
        let order = std::cell::RefCell::new(Vec::new());
        let mut a = || -> Result<f64, Box<dyn Error>> {
            order.borrow_mut().push('a');
            Ok(1.0)
        };
        let mut b = || -> Result<f64, Box<dyn Error>> {
            order.borrow_mut().push('b');
            Ok(2.0)
        };
        let medians = alternate(3, &mut [&mut a, &mut b]).unwrap();
        assert_eq!(medians, [1.0, 2.0]);
        assert_eq!(order.into_inner(), vec!['a', 'b', 'a', 'b', 'a', 'b']);
    }

    #[test]
    fn test_json_shape() {
        let mut report = SuiteReport::default();
        report.metric("x_ns", 1.5).note("hello");
        let json = report.to_json("demo");
        assert_eq!(json["suite"], "demo");
        assert_eq!(json["metrics"]["x_ns"], 1.5);
        assert_eq!(json["notes"], "hello");
    }

    #[test]
    fn test_format_value_three_digits() {
        assert_eq!(format_value(1234.5678), "1235");
        assert_eq!(format_value(12.345), "12.3");
        assert_eq!(format_value(0.012345), "0.0123");
    }

    #[test]
    fn test_quick_mode_uses_one_rep() {
        let ctx = Ctx::new(true, 9, None);
        assert_eq!(ctx.reps(), 1);
        assert_eq!(ctx.pick(10, 1), 1);
    }
}
