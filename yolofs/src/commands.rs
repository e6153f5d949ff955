//! The subcommands other than `mount` and `keep`: build, inspect and verify boot images, talk to
//! a running mount, pin the hypervisor's files.

use std::fs::File;
use std::io::ErrorKind;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::json;
use sha2::{Digest, Sha256};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use yolofs::build::{self, BuildSummary};
use yolofs::control;
use yolofs::format::{BootImage, SourceIdentity};
use yolofs::pin;
use yolofs::store;

use crate::cli::BuildArgs;
use crate::mount::next_signal;

fn sha256_file(path: &Path) -> Result<String> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(format!("sha256:{:x}", hasher.finalize()))
}

pub fn build_command(args: BuildArgs) -> Result<()> {
    let started = Instant::now();
    let source = File::open(&args.source).with_context(|| format!("opening source {}", args.source.display()))?;
    let reads = match (&args.trace, &args.like) {
        (Some(trace), _) => build::read_trace(trace).with_context(|| format!("reading trace {}", trace.display()))?,
        (None, Some(like)) => build::shared_blocks(&open_boot_image(like)?, &source)
            .with_context(|| format!("comparing {} with {}", like.display(), args.source.display()))?,
        (None, None) => unreachable!("clap requires --trace or --like"),
    };
    let source_digest = if args.source_digest == "auto" {
        sha256_file(&args.source)?
    } else {
        args.source_digest
    };
    let identity = SourceIdentity {
        image_id: args.image_id,
        source_digest,
        rendition: args.rendition,
        source_size: source.metadata()?.len(),
    };
    // Taken before the build reads the source: the stamp vouches for the bytes as they were then.
    let source_key = store::SourceKey::of(&source)?;
    let summary: BuildSummary = build::build_boot_image(&reads, &source, &identity, args.block_size, &args.output)
        .with_context(|| format!("building {}", args.output.display()))?;
    if args.mark {
        let image = BootImage::open(&args.output)?;
        store::write_stamp(&args.output, &image, source_key)?;
    }
    let seconds = started.elapsed().as_secs_f64();
    if args.json {
        println!("{}", json!({ "summary": summary, "seconds": seconds }));
    } else {
        println!(
            "built {}: {} reads ({} bytes) -> {} extents, {} bytes covered, boot image {} bytes ({:.1}% of the {}-byte source) in {:.2}s",
            args.output.display(),
            summary.reads,
            summary.read_bytes,
            summary.extents,
            summary.covered_bytes,
            summary.boot_image_bytes,
            100.0 * summary.covered_bytes as f64 / summary.source_size.max(1) as f64,
            summary.source_size,
            seconds
        );
    }
    Ok(())
}

fn open_boot_image(path: &Path) -> Result<BootImage> {
    BootImage::open(path).with_context(|| format!("invalid boot image {}", path.display()))
}

pub fn inspect(path: &Path, as_json: bool, list_extents: bool) -> Result<()> {
    let image = open_boot_image(path)?;
    let packed = yolofs::packed::file_is_packed(path);
    let summary = json!({
        "path": path,
        "format_version": yolofs::format::VERSION,
        // Kept packed in a store, its data in the store's block file.
        "packed": packed,
        "identity": image.identity,
        "block_size": image.block_size,
        "created_unix": image.created_unix,
        "extent_count": image.extents.len(),
        "covered_bytes": image.covered_bytes(),
        "coverage": image.covered_bytes() as f64 / image.identity.source_size.max(1) as f64,
        "header_crc32c": format!("{:08x}", image.header_crc32c),
        "index_crc32c": format!("{:08x}", image.index_crc32c),
    });
    if as_json {
        let mut out = summary;
        if list_extents {
            out["extents"] = serde_json::to_value(&image.extents)?;
        }
        println!("{out}");
        return Ok(());
    }
    println!("boot image    {}", path.display());
    println!(
        "format        version {}{}",
        yolofs::format::VERSION,
        if packed { ", packed in a store" } else { "" }
    );
    println!(
        "image id      {}",
        if image.identity.image_id.is_empty() {
            "-"
        } else {
            &image.identity.image_id
        }
    );
    println!(
        "source digest {}",
        if image.identity.source_digest.is_empty() {
            "-"
        } else {
            &image.identity.source_digest
        }
    );
    println!("rendition     {}", image.identity.rendition);
    println!("source size   {} bytes", image.identity.source_size);
    println!("block size    {} bytes", image.block_size);
    println!("extents       {}", image.extents.len());
    println!(
        "covered       {} bytes ({:.2}% of the source)",
        image.covered_bytes(),
        100.0 * image.covered_bytes() as f64 / image.identity.source_size.max(1) as f64
    );
    if list_extents {
        println!(
            "{:>14} {:>10} {:>12} {:>10}",
            "offset", "length", "data offset", "crc32c"
        );
        for e in &image.extents {
            println!(
                "{:>14} {:>10} {:>12} {:>10x}",
                e.source_offset, e.length, e.data_offset, e.crc32c
            );
        }
    }
    Ok(())
}

pub fn verify(path: &Path, source_path: &Path, mark: bool, as_json: bool) -> Result<()> {
    let image = open_boot_image(path)?;
    let source = File::open(source_path).with_context(|| format!("opening source {}", source_path.display()))?;
    let started = Instant::now();
    let verified = if mark {
        store::verify_and_stamp(path, &image, &source)
    } else {
        image.verify_against(&source).map_err(store::StampError::from)
    };
    match verified {
        Ok(()) => {}
        Err(store::StampError::Write(e)) => return Err(e).context("writing the verification stamp"),
        Err(e) => {
            return Err(e).with_context(|| format!("{} does not match {}", path.display(), source_path.display()))
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    if as_json {
        println!(
            "{}",
            json!({ "ok": true, "extents": image.extents.len(), "bytes": image.covered_bytes(), "seconds": seconds, "marked": mark })
        );
    } else {
        println!(
            "ok: {} extents ({} bytes) match {} ({seconds:.2}s)",
            image.extents.len(),
            image.covered_bytes(),
            source_path.display()
        );
    }
    Ok(())
}

pub fn shared(paths: &[std::path::PathBuf], block_size: usize, as_json: bool) -> Result<()> {
    if block_size == 0 {
        bail!("--block-size must be at least 1");
    }
    let images = paths.iter().map(|p| open_boot_image(p)).collect::<Result<Vec<_>>>()?;
    let sharing = build::Sharing::of(&images, block_size);
    if as_json {
        println!(
            "{}",
            json!({ "boot_images": images.len(), "block_size": block_size, "sharing": sharing })
        );
    } else {
        println!(
            "{} boot images: {} bytes of data, {} bytes in distinct {}-byte blocks ({:.2}x)",
            images.len(),
            sharing.data_bytes,
            sharing.distinct_bytes,
            block_size,
            sharing.data_bytes as f64 / sharing.distinct_bytes.max(1) as f64
        );
    }
    Ok(())
}

pub fn ctl(socket: &Path, mut request: control::Request) -> Result<()> {
    // The daemon resolves paths from its own working directory: send an absolute one.
    if let control::Request::Install { boot_image, .. } = &mut request {
        *boot_image = std::path::absolute(&*boot_image)?;
    }
    let request = serde_json::to_value(&request)?;
    let answer = match control::call(socket, &request) {
        Ok(answer) => answer,
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) => bail!(
            "no yolofs is running with control socket {} (nothing listens there; --socket names another)",
            socket.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("talking to {}", socket.display())),
    };
    println!("{}", serde_json::to_string_pretty(&answer)?);
    if answer["ok"] != json!(true) {
        bail!("{}", answer["error"].as_str().unwrap_or("request failed"));
    }
    Ok(())
}

pub fn pin_command(binaries: &[String], list: bool) -> Result<()> {
    let files = pin::files_to_pin(binaries);
    if list {
        for file in &files {
            println!("{}", file.display());
        }
        return Ok(());
    }
    let mut signals = Signals::new([SIGTERM, SIGINT])?;
    let pinned = pin::pin(&files);
    for (path, bytes) in pinned.files() {
        println!("{bytes:>12} {}", path.display());
    }
    println!("pinned {} bytes; holding until SIGTERM", pinned.bytes());
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);
    next_signal(&mut signals);
    Ok(())
}
