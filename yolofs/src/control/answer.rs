//! The answers of the control socket, one type per request (the requests are
//! [`Request`](super::Request)).
//!
//! A request that succeeded is answered with one JSON object: `"ok": true` and the answer's
//! fields. One that failed is answered with `"ok": false`, its `error` and whether the boot image
//! handed in was `refused` ([`Failure`]). Every answer is written through a
//! [`serde_json::Value`], so its keys come sorted: the bytes the Python client has always read.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use super::Failure;
use crate::hostload::HostLoad;
use crate::pool::PoolStats;
use crate::recorder::RecordingInfo;
use crate::stats::FileStatsSnapshot;
use crate::store::{BootImageInfo, Installed, LoadedInfo, PreloadProgress, TouchSafety};

/// The answer to a request that succeeded, one kind per request. On the wire, its fields follow
/// `"ok": true` in one JSON object.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Answer {
    Status(Box<StatusAnswer>),
    Stats(StatsAnswer),
    Preload(PreloadAnswer),
    Evict(EvictAnswer),
    Touch(TouchAnswer),
    HostLoad(HostLoad),
    RecordStop(RecordStopAnswer),
    Install(InstallAnswer),
    Remember(RememberAnswer),
    FillBegin(FillBeginAnswer),
    FillDone(FillDoneAnswer),
    FillWants(FillWantsAnswer),
    FillEnd(FillEndAnswer),
    Prune(PruneAnswer),
}

/// The answer to `status`.
#[derive(Debug, Serialize)]
pub struct StatusAnswer {
    pub version: &'static str,
    pub pid: u32,
    /// This process took the mount over from an earlier yolofs (a restart under a keeper).
    pub took_over_mount: bool,
    pub source: PathBuf,
    pub mountpoint: PathBuf,
    pub boot_image_dir: PathBuf,
    pub uptime_seconds: f64,
    pub memory_budget_bytes: u64,
    pub memory_used_bytes: u64,
    pub lock_in_memory: bool,
    /// What the block pool the loaded boot images share holds; absent with
    /// `--no-block-sharing`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_pool: Option<PoolStats>,
    /// What the store's block file holds of the boot images installed; absent with
    /// `--no-block-sharing`, and while the store has none (nothing installed yet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_file: Option<crate::packed::BlockFileStats>,
    pub loaded: Vec<LoadedInfo>,
    pub rejected: Vec<RejectedInfo>,
    pub boot_images: Vec<BootImageInfo>,
    /// The mount learns boot images (`--learn`).
    pub learning: bool,
    /// The boot windows open.
    pub recording: Vec<RecordingInfo>,
    pub open_files: usize,
    pub pinned_bytes: u64,
    pub kernel_passthrough: bool,
    pub touch_safety: TouchSafety,
    pub fills: Vec<FillInfo>,
    /// What preloading at start (`--preload`) has done; absent without it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preload: Option<PreloadProgress>,
}

/// A boot image refused (until its file changes), for `status`.
#[derive(Debug, Serialize)]
pub struct RejectedInfo {
    pub name: String,
    pub reason: String,
}

/// A fill under way, for `status`.
#[derive(Debug, Serialize)]
pub struct FillInfo {
    pub file: String,
    pub size: u64,
    pub filled_bytes: u64,
}

/// The answer to `stats`: the statistics of every file, or of the one asked for.
#[derive(Debug, Serialize)]
pub struct StatsAnswer {
    pub files: BTreeMap<String, FileStatsSnapshot>,
}

/// The answer to `preload`: the boot image loaded.
#[derive(Debug, Serialize)]
pub struct PreloadAnswer {
    pub file: String,
    pub extents: usize,
    pub bytes: u64,
    pub locked: bool,
}

/// The answer to `evict`: whether the boot image was in memory.
#[derive(Debug, Serialize)]
pub struct EvictAnswer {
    pub file: String,
    pub evicted: bool,
}

/// The answer to `touch`: whether its boot image's verification was kept.
#[derive(Debug, Serialize)]
pub struct TouchAnswer {
    pub file: String,
    pub verification_kept: bool,
}

/// The answer to `record_stop`.
#[derive(Debug, Serialize)]
pub struct RecordStopAnswer {
    pub file: String,
    /// A boot window was open (one that already ended is not an error).
    pub window_was_open: bool,
    /// The file has a boot image now.
    pub built: bool,
}

/// The answer to `install`.
#[derive(Debug, Serialize)]
pub struct InstallAnswer {
    pub installed: Installed,
}

/// The answer to `remember`: whether the record changed.
#[derive(Debug, Serialize)]
pub struct RememberAnswer {
    pub file: String,
    pub image_id: String,
    pub changed: bool,
}

/// The answer to `fill_begin`.
#[derive(Debug, Serialize)]
pub struct FillBeginAnswer {
    pub file: String,
    pub size: u64,
    /// The fill began with this request (not an earlier one's).
    pub new: bool,
    pub filled_bytes: u64,
}

/// The answer to `fill_done`: the fill's progress.
#[derive(Debug, Serialize)]
pub struct FillDoneAnswer {
    pub file: String,
    pub filled_bytes: u64,
    pub size: u64,
}

/// The answer to `fill_wants`: the ranges reads wait for, as `[offset, length]`.
#[derive(Debug, Serialize)]
pub struct FillWantsAnswer {
    pub file: String,
    pub wants: Vec<[u64; 2]>,
}

/// The answer to `fill_end`. A failed fill's answer says only whether a fill was ended; a
/// complete one's also whether the boot image served matches the filled data, and if not, how.
#[derive(Debug, Serialize)]
pub struct FillEndAnswer {
    pub file: String,
    pub ended: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_image_matches: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mismatch: Option<String>,
}

/// The answer to `prune`: the store's files deleted.
#[derive(Debug, Serialize)]
pub struct PruneAnswer {
    pub removed: Vec<String>,
}

/// A request that succeeded, as sent.
#[derive(Serialize)]
struct Succeeded {
    ok: bool,
    #[serde(flatten)]
    answer: Answer,
}

/// A request that failed, as sent; `refused` is left out of the answer to a request that was
/// never read (too long, or one client too many).
#[derive(Serialize)]
pub(super) struct Failed<'a> {
    pub ok: bool,
    pub error: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<bool>,
}

/// The line (without its newline) that answers a request: `{"ok": true, ...the answer's
/// fields}`, or `{"ok": false, "error": ..., "refused": ...}`.
pub(super) fn reply_line(outcome: Result<Answer, Failure>) -> String {
    match outcome {
        Ok(answer) => json_line(&Succeeded { ok: true, answer }),
        Err(Failure { error, refused }) => json_line(&Failed {
            ok: false,
            error: &error,
            refused: Some(refused),
        }),
    }
}

/// `answer` as one line of JSON, written through a [`serde_json::Value`], whose objects keep their
/// keys sorted: the order answers have always had on the wire.
pub(super) fn json_line(answer: &impl Serialize) -> String {
    match serde_json::to_value(answer) {
        Ok(value) => value.to_string(),
        // Only a path that is not UTF-8 (in `status`) has no JSON.
        Err(e) => json_line(&Failed {
            ok: false,
            error: &format!("the answer has no JSON form: {e}"),
            refused: Some(false),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_one_object_with_sorted_keys() {
        let evicted = Answer::Evict(EvictAnswer {
            file: "disk".into(),
            evicted: true,
        });
        assert_eq!(reply_line(Ok(evicted)), r#"{"evicted":true,"file":"disk","ok":true}"#);
        let wants = Answer::FillWants(FillWantsAnswer {
            file: "disk.yolo-fill".into(),
            wants: vec![[0, 4096]],
        });
        assert_eq!(
            reply_line(Ok(wants)),
            r#"{"file":"disk.yolo-fill","ok":true,"wants":[[0,4096]]}"#
        );
        // A failed fill's answer has no verdict on its boot image.
        let ended = |boot_image_matches, mismatch| {
            reply_line(Ok(Answer::FillEnd(FillEndAnswer {
                file: "f".into(),
                ended: true,
                boot_image_matches,
                mismatch,
            })))
        };
        assert_eq!(ended(None, None), r#"{"ended":true,"file":"f","ok":true}"#);
        assert_eq!(
            ended(Some(false), Some("extent 0".into())),
            r#"{"boot_image_matches":false,"ended":true,"file":"f","mismatch":"extent 0","ok":true}"#
        );
        let failure = Failure {
            error: "no".into(),
            refused: true,
        };
        assert_eq!(reply_line(Err(failure)), r#"{"error":"no","ok":false,"refused":true}"#);
        let unread = Failed {
            ok: false,
            error: "too long",
            refused: None,
        };
        assert_eq!(json_line(&unread), r#"{"error":"too long","ok":false}"#);
    }
}
