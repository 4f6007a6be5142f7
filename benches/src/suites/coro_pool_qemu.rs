// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! QEMU's pooled coroutine lifecycle, measured in the same run as the
//! `coro-pool` suite: `coro_pool_qemu.c` (QEMU's `perf_lifecycle` loop)
//! linked against the `libqemuutil.a` of a QEMU build on this machine.
//!
//! The build is found through `VMM_BENCHES_QEMU_BUILD` (a QEMU build
//! directory) or under `/var/cache/virtio-9p-ci/src/qemu-*/build*/`, where
//! the workspace's guest runs build QEMU. Meson makes `libqemuutil.a` a thin
//! archive (member paths into the build tree), so its members are copied
//! into a scratch directory and archived again before linking.

use std::path::{Path, PathBuf};
use std::process::Command;

type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

const SOURCE: &str = include_str!("coro_pool_qemu.c");

/// Where the workspace's guest runs keep their QEMU source and builds.
const QEMU_CACHE: &str = "/var/cache/virtio-9p-ci/src";

/// The QEMU lifecycle driver, built and ready to run.
pub struct QemuLifecycle {
    exe: PathBuf,
    /// The QEMU build it links (for the report's note).
    pub build: PathBuf,
    _dir: tempfile::TempDir,
}

/// A QEMU build directory with a `libqemuutil.a`.
fn find_build() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("VMM_BENCHES_QEMU_BUILD") {
        let dir = PathBuf::from(dir);
        return dir.join("libqemuutil.a").is_file().then_some(dir);
    }
    let mut found = Vec::new();
    for src in std::fs::read_dir(QEMU_CACHE).ok()?.flatten() {
        if !src.file_name().to_string_lossy().starts_with("qemu-") {
            continue;
        }
        for build in std::fs::read_dir(src.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let dir = build.path();
            let name = build.file_name();
            if name.to_string_lossy().starts_with("build") && dir.join("libqemuutil.a").is_file() {
                found.push(dir);
            }
        }
    }
    found.sort();
    found.pop()
}

fn run(cmd: &mut Command) -> BoxResult<String> {
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// `lib` as an ordinary archive in `dir` (a thin one's members copied in).
fn flat_archive(lib: &Path, dir: &Path) -> BoxResult<PathBuf> {
    let head = std::fs::read(lib)?;
    if !head.starts_with(b"!<thin>\n") {
        return Ok(lib.to_path_buf());
    }
    let base = lib.parent().ok_or("libqemuutil.a has no directory")?;
    let objs = dir.join("objs");
    std::fs::create_dir_all(&objs)?;
    let mut copies = Vec::new();
    for member in run(Command::new("ar").arg("t").arg(lib))?.lines() {
        let copy = objs.join(member.replace('/', "_"));
        std::fs::copy(base.join(member), &copy)?;
        copies.push(copy);
    }
    let flat = dir.join("libqemuutil.a");
    run(Command::new("ar").arg("rcs").arg(&flat).args(&copies))?;
    Ok(flat)
}

impl QemuLifecycle {
    /// Builds the driver, or says why it cannot.
    pub fn build() -> Result<QemuLifecycle, String> {
        let build = find_build().ok_or_else(|| {
            format!(
                "no QEMU build with libqemuutil.a (set VMM_BENCHES_QEMU_BUILD or build QEMU \
                 under {QEMU_CACHE}/qemu-*/build*)"
            )
        })?;
        Self::build_from(&build).map_err(|e| format!("{}: {e}", build.display()))
    }

    fn build_from(build: &Path) -> BoxResult<QemuLifecycle> {
        let dir = tempfile::tempdir()?;
        let lib = flat_archive(&build.join("libqemuutil.a"), dir.path())?;
        let src = dir.path().join("qemu-lifecycle.c");
        std::fs::write(&src, SOURCE)?;
        let glib = run(Command::new("pkg-config").args(["--libs", "glib-2.0"]))?;
        let exe = dir.path().join("qemu-lifecycle");
        run(Command::new("cc")
            .args(["-O2", "-o"])
            .arg(&exe)
            .arg(&src)
            .arg("-Wl,--start-group")
            .arg(&lib)
            .args(["-lrt", "-lz"])
            .args(glib.split_whitespace())
            .args(["-lm", "-Wl,--end-group", "-pthread"]))?;
        Ok(QemuLifecycle {
            exe,
            build: build.to_path_buf(),
            _dir: dir,
        })
    }

    /// ns of thread CPU time per pooled lifecycle, `iters` iterations (the
    /// median of `rounds` rounds in one process).
    pub fn run(&self, iters: usize, rounds: usize) -> BoxResult<f64> {
        let out = run(Command::new(&self.exe)
            .arg(iters.to_string())
            .arg(rounds.to_string()))?;
        let ns: Vec<f64> = out
            .lines()
            .filter_map(|l| l.strip_prefix("lifecycle_ns "))
            .map(|v| v.trim().parse())
            .collect::<Result<_, _>>()?;
        if ns.is_empty() {
            return Err(format!("qemu-lifecycle printed no figure: {out:?}").into());
        }
        Ok(crate::harness::median(&ns))
    }
}
