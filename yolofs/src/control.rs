//! The control socket: a Unix stream socket speaking JSON lines.
//!
//! Each line a client writes is one [`Request`], tagged by `"op"`; each answer is one JSON line,
//! `{"ok": true, ...}` or `{"ok": false, "error": "..."}`. This is the only interface Nova's and
//! Glance's Python code use to talk to a running yolofs.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use log::{debug, warn};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::fs::MirrorFs;
use crate::hostload::HostLoadSampler;
use crate::recorder::Recorder;
use crate::stats::StatsRegistry;
use crate::store::BootImageStore;

/// Every request the control socket understands (also the subcommands of `yolofs ctl`).
#[derive(Debug, Deserialize, Serialize, PartialEq, clap::Subcommand)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Mount, memory and recording state.
    Status,
    /// Read statistics of every file, or of one.
    Stats { file: Option<String> },
    /// Load (and verify if needed) the boot image of a base file now, before the boot opens it.
    Preload { file: String },
    /// Drop a boot image from memory.
    Evict { file: String },
    /// Smoothed host I/O and CPU utilisation.
    HostLoad,
    /// End the recording window of a file now and build its boot image.
    RecordStop { file: String },
}

/// What the control socket serves requests from.
pub struct Daemon {
    pub source: PathBuf,
    pub mountpoint: PathBuf,
    pub fs: Arc<MirrorFs>,
    pub store: Arc<BootImageStore>,
    pub stats: Arc<StatsRegistry>,
    pub recorder: Option<Arc<Recorder>>,
    pub host_load: Arc<HostLoadSampler>,
    pub pinned_bytes: u64,
    pub started: Instant,
}

fn base_file_name(file: &str) -> Result<&str, String> {
    if file.is_empty() || file.contains('/') || file == "." || file == ".." {
        return Err(format!("invalid base file name {file:?}"));
    }
    Ok(file)
}

impl Daemon {
    pub fn handle(&self, request: Request) -> Result<Value, String> {
        match request {
            Request::Status => Ok(json!({
                "version": env!("CARGO_PKG_VERSION"),
                "source": self.source,
                "mountpoint": self.mountpoint,
                "boot_image_dir": self.store.config().dir,
                "uptime_seconds": self.started.elapsed().as_secs_f64(),
                "memory_budget_bytes": self.store.config().memory_budget,
                "memory_used_bytes": self.store.used_bytes(),
                "lock_in_memory": self.store.config().lock_in_memory,
                "loaded": self.store.loaded(),
                "rejected": self.store.rejected().into_iter().map(|(n, r)| json!({"name": n, "reason": r})).collect::<Vec<_>>(),
                "learning": self.recorder.is_some(),
                "recording": self.recorder.as_ref().map(|r| r.active()).unwrap_or_default(),
                "open_files": self.fs.open_handles(),
                "pinned_bytes": self.pinned_bytes,
                "kernel_passthrough": self.fs.kernel_passthrough(),
            })),
            Request::Stats { file } => Ok(json!({ "files": self.stats.snapshot(file.as_deref()) })),
            Request::Preload { file } => {
                let name = base_file_name(&file)?;
                let source = File::open(self.source.join(name)).map_err(|e| format!("{name}: {e}"))?;
                let image = self.store.load(name, &source).map_err(|e| e.to_string())?;
                Ok(
                    json!({ "file": name, "extents": image.extents.len(), "bytes": image.data_len(), "locked": image.is_locked() }),
                )
            }
            Request::Evict { file } => {
                let name = base_file_name(&file)?;
                Ok(json!({ "file": name, "evicted": self.store.evict(name) }))
            }
            Request::HostLoad => serde_json::to_value(self.host_load.current()).map_err(|e| e.to_string()),
            Request::RecordStop { file } => {
                let name = base_file_name(&file)?;
                let recorder = self
                    .recorder
                    .as_ref()
                    .ok_or("this mount is not learning boot images (--learn)")?;
                if !recorder.stop(name) {
                    return Err(format!("{name} is not being recorded"));
                }
                recorder.wait_idle();
                Ok(json!({ "file": name, "built": self.store.path_for(name).exists() }))
            }
        }
    }

    fn answer(&self, line: &str) -> Value {
        let result = serde_json::from_str::<Request>(line)
            .map_err(|e| format!("bad request: {e}"))
            .and_then(|r| self.handle(r));
        match result {
            Ok(Value::Object(mut fields)) => {
                fields.insert("ok".into(), Value::Bool(true));
                Value::Object(fields)
            }
            Ok(other) => json!({ "ok": true, "result": other }),
            Err(error) => json!({ "ok": false, "error": error }),
        }
    }

    fn serve_client(&self, stream: UnixStream) -> std::io::Result<()> {
        let mut writer = stream.try_clone()?;
        for line in BufReader::new(stream).lines() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let answer = self.answer(&line);
            debug!("control: {line} -> ok={}", answer["ok"]);
            writeln!(writer, "{answer}")?;
        }
        Ok(())
    }
}

/// Listens on `path` (replacing a stale socket) and serves each client in its own thread.
pub fn serve(path: &Path, daemon: Arc<Daemon>) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    thread::Builder::new().name("yolofs-control".into()).spawn(move || {
        for stream in listener.incoming() {
            match stream {
                Ok(stream) => {
                    let daemon = daemon.clone();
                    let _ = thread::Builder::new().name("yolofs-client".into()).spawn(move || {
                        if let Err(e) = daemon.serve_client(stream) {
                            debug!("control client: {e}");
                        }
                    });
                }
                Err(e) => warn!("control socket: {e}"),
            }
        }
    })?;
    Ok(())
}

/// Sends one request to a running yolofs and returns its answer.
pub fn call(path: &Path, request: &Value) -> std::io::Result<Value> {
    let mut stream = UnixStream::connect(path)?;
    writeln!(stream, "{request}")?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    serde_json::from_str(&line).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_by_op() {
        let parse = |s: &str| serde_json::from_str::<Request>(s);
        assert_eq!(parse(r#"{"op":"status"}"#).unwrap(), Request::Status);
        assert_eq!(parse(r#"{"op":"stats"}"#).unwrap(), Request::Stats { file: None });
        assert_eq!(
            parse(r#"{"op":"preload","file":"abc"}"#).unwrap(),
            Request::Preload { file: "abc".into() }
        );
        assert_eq!(
            parse(r#"{"op":"record_stop","file":"abc"}"#).unwrap(),
            Request::RecordStop { file: "abc".into() }
        );
        assert!(parse(r#"{"op":"format_disk"}"#).is_err());
        assert!(parse(r#"{"op":"evict"}"#).is_err());
    }

    #[test]
    fn requests_serialise_to_what_they_parse_from() {
        for request in [
            Request::Status,
            Request::Stats {
                file: Some("abc".into()),
            },
            Request::RecordStop { file: "x".into() },
        ] {
            let line = serde_json::to_string(&request).unwrap();
            assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), request);
        }
        assert_eq!(
            serde_json::to_string(&Request::HostLoad).unwrap(),
            r#"{"op":"host_load"}"#
        );
    }

    #[test]
    fn file_names_cannot_escape_the_source_directory() {
        assert!(base_file_name("../etc/passwd").is_err());
        assert!(base_file_name("..").is_err());
        assert!(base_file_name("").is_err());
        assert_eq!(base_file_name("0123abcd"), Ok("0123abcd"));
    }
}
