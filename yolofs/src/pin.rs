//! Pinning the hypervisor's files in page cache (what the paper did with `vmtouch -l`).
//!
//! Every QEMU start reads its binary, its shared libraries and its firmware (BIOS, option ROMs).
//! Under I/O contention those reads queue behind everybody else's, so they are mapped and locked
//! with `mlock` for as long as the pinning process lives. The files are found automatically: the
//! QEMU binaries on PATH (or named), the libraries `ldd` lists for them, and QEMU's firmware
//! directories.

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use log::{info, warn};

/// Binaries pinned when none is named.
pub const DEFAULT_BINARIES: &[&str] = &["qemu-system-x86_64", "qemu-img"];
/// Firmware directories QEMU reads at start.
pub const FIRMWARE_DIRS: &[&str] = &["/usr/share/seabios", "/usr/share/qemu", "/usr/lib/ipxe/qemu"];

/// Finds `name` on PATH (or returns it if it is a path).
pub fn which(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Some(PathBuf::from(name)).filter(|p| p.is_file());
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file())
}

/// Shared libraries a binary loads, from `ldd`'s output (`name => /path (0x...)` and `/path (0x...)`).
pub fn shared_libraries(binary: &Path) -> io::Result<Vec<PathBuf>> {
    let output = Command::new("ldd").arg(binary).output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(parse_ldd(&text))
}

fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let path = match line.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// The files to pin for `binaries` (QEMU's when empty): binaries, libraries, firmware.
pub fn files_to_pin(binaries: &[String]) -> Vec<PathBuf> {
    let names: Vec<&str> = if binaries.is_empty() {
        DEFAULT_BINARIES.to_vec()
    } else {
        binaries.iter().map(String::as_str).collect()
    };
    let mut files = BTreeSet::new();
    for name in names {
        let Some(binary) = which(name) else {
            warn!("pin: {name} not found");
            continue;
        };
        match shared_libraries(&binary) {
            Ok(libs) => files.extend(libs),
            Err(e) => warn!("pin: ldd {}: {e}", binary.display()),
        }
        files.insert(binary);
    }
    for dir in FIRMWARE_DIRS {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        files.extend(entries.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_file()));
    }
    files
        .into_iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Files mapped and locked in memory; unlocked when dropped.
pub struct Pinned {
    maps: Vec<(PathBuf, memmap2::Mmap)>,
}

impl Pinned {
    pub fn files(&self) -> impl Iterator<Item = (&Path, u64)> {
        self.maps.iter().map(|(p, m)| (p.as_path(), m.len() as u64))
    }

    pub fn bytes(&self) -> u64 {
        self.maps.iter().map(|(_, m)| m.len() as u64).sum()
    }
}

/// Maps and locks each file; files that cannot be locked are reported and skipped.
pub fn pin(files: &[PathBuf]) -> Pinned {
    let mut maps = Vec::new();
    for path in files {
        match pin_one(path) {
            Ok(Some(map)) => maps.push((path.clone(), map)),
            Ok(None) => {}
            Err(e) => warn!("pin: {}: {e}", path.display()),
        }
    }
    let pinned = Pinned { maps };
    info!(
        "pinned {} files, {} bytes, in page cache",
        pinned.maps.len(),
        pinned.bytes()
    );
    pinned
}

fn pin_one(path: &Path) -> io::Result<Option<memmap2::Mmap>> {
    let file = File::open(path)?;
    if file.metadata()?.len() == 0 {
        return Ok(None);
    }
    // SAFETY: the mapping is read-only and never dereferenced by us; it exists only to be locked.
    // A concurrent truncation of the file could make accesses fault, but nothing accesses it.
    let map = unsafe { memmap2::Mmap::map(&file)? };
    map.lock()?;
    Ok(Some(map))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_lines_of_both_shapes_are_parsed() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x7f)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x7f)\n\tlibgone.so => not found\n";
        assert_eq!(
            parse_ldd(text),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libz.so.1"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2")
            ]
        );
    }
}
