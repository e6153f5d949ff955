//! Base files being filled: a guest boots from a base file before its download has finished
//! (docs/first-boot.md).
//!
//! Nova's driver writes the *fill file* (`_base/NAME.yolo-fill`, sparse, at its final size) in
//! the background and reports each range it has written. A read of the mount that the boot image
//! does not cover waits here until its bytes are filled, for a bounded time: it never sees the
//! zeros of a hole. The ranges such reads wait for are the driver's *wants*: for raw images it
//! fetches them from Glance at once with HTTP Range requests.

use std::ops::Range;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use rangemap::RangeSet;

/// The suffix of a fill file's name in the source directory.
pub const FILL_SUFFIX: &str = ".yolo-fill";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Filling,
    /// Every byte is in the fill file, verified.
    Complete,
    /// The fill stopped; its file is not to be read.
    Failed(String),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FillError {
    #[error("bytes {0}..{1} still missing after {2:?}")]
    TimedOut(u64, u64, Duration),
    #[error("the fill failed: {0}")]
    Failed(String),
    #[error("bytes {0}..{1} are beyond the file's {2} bytes")]
    OutOfRange(u64, u64, u64),
}

struct State {
    filled: RangeSet<u64>,
    wanted: RangeSet<u64>,
    outcome: Outcome,
}

/// One base file being filled.
pub struct Fill {
    size: u64,
    state: Mutex<State>,
    changed: Condvar,
}

impl Fill {
    pub fn new(size: u64) -> Fill {
        Fill {
            size,
            state: Mutex::new(State {
                filled: RangeSet::new(),
                wanted: RangeSet::new(),
                outcome: Outcome::Filling,
            }),
            changed: Condvar::new(),
        }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    fn check(&self, range: &Range<u64>) -> Result<(), FillError> {
        if range.start > range.end || range.end > self.size {
            return Err(FillError::OutOfRange(range.start, range.end, self.size));
        }
        Ok(())
    }

    /// Records that `range` of the fill file holds its final bytes; wakes the reads waiting
    /// for them.
    pub fn filled(&self, range: Range<u64>) -> Result<(), FillError> {
        self.check(&range)?;
        if range.is_empty() {
            return Ok(());
        }
        let mut state = self.state.lock().unwrap();
        state.wanted.remove(range.clone());
        state.filled.insert(range);
        self.changed.notify_all();
        Ok(())
    }

    /// Waits until every byte of `ranges` is filled, at most `timeout` in all.
    pub fn wait_filled(&self, ranges: &[Range<u64>], timeout: Duration) -> Result<(), FillError> {
        for range in ranges {
            self.check(range)?;
        }
        let deadline = Instant::now() + timeout;
        let mut state = self.state.lock().unwrap();
        loop {
            match &state.outcome {
                Outcome::Complete => return Ok(()),
                Outcome::Failed(reason) => return Err(FillError::Failed(reason.clone())),
                Outcome::Filling => {}
            }
            let missing: Vec<Range<u64>> = ranges
                .iter()
                .filter(|range| !range.is_empty())
                .flat_map(|range| state.filled.gaps(range).collect::<Vec<_>>())
                .collect();
            let Some(first) = missing.first().cloned() else {
                return Ok(());
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(FillError::TimedOut(first.start, first.end, timeout));
            }
            let new_wants = missing.iter().any(|range| state.wanted.gaps(range).next().is_some());
            for range in missing {
                state.wanted.insert(range);
            }
            if new_wants {
                self.changed.notify_all();
            }
            state = self.changed.wait_timeout(state, deadline - now).unwrap().0;
        }
    }

    /// The ranges reads are waiting for, waiting up to `timeout` for one while there is none.
    pub fn wants(&self, timeout: Duration) -> Vec<Range<u64>> {
        let deadline = Instant::now() + timeout;
        let mut state = self.state.lock().unwrap();
        loop {
            if state.outcome != Outcome::Filling || !state.wanted.is_empty() {
                return state.wanted.iter().cloned().collect();
            }
            let now = Instant::now();
            if now >= deadline {
                return Vec::new();
            }
            state = self.changed.wait_timeout(state, deadline - now).unwrap().0;
        }
    }

    /// Ends the fill: every waiting read is answered (served, or failed with `Failed`).
    pub fn finish(&self, outcome: Outcome) {
        let mut state = self.state.lock().unwrap();
        if outcome == Outcome::Complete && self.size > 0 {
            state.filled.insert(0..self.size);
        }
        state.wanted = RangeSet::new();
        state.outcome = outcome;
        self.changed.notify_all();
    }

    pub fn is_complete(&self) -> bool {
        self.state.lock().unwrap().outcome == Outcome::Complete
    }

    /// Bytes filled so far, and the outcome.
    pub fn progress(&self) -> (u64, Outcome) {
        let state = self.state.lock().unwrap();
        let filled = state.filled.iter().map(|r| r.end - r.start).sum::<u64>().min(self.size);
        (filled, state.outcome.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread;

    const SHORT: Duration = Duration::from_millis(50);
    const LONG: Duration = Duration::from_secs(10);

    #[test]
    fn filled_ranges_are_served_at_once_and_holes_time_out() {
        let fill = Fill::new(1000);
        fill.filled(0..100).unwrap();
        fill.filled(100..200).unwrap();
        assert_eq!(fill.wait_filled(&[10..150, 190..200], SHORT), Ok(()));
        assert_eq!(
            fill.wait_filled(std::slice::from_ref(&(150..250)), SHORT),
            Err(FillError::TimedOut(200, 250, SHORT))
        );
        assert_eq!(fill.progress(), (200, Outcome::Filling));
    }

    #[test]
    fn a_waiting_read_is_a_want_until_its_bytes_arrive() {
        let fill = Arc::new(Fill::new(1 << 20));
        let reader = {
            let fill = fill.clone();
            thread::spawn(move || fill.wait_filled(&[4096..8192, 65536..65537], LONG))
        };
        let mut wants = Vec::new();
        while wants.len() < 2 {
            wants = fill.wants(LONG);
        }
        assert_eq!(wants, vec![4096..8192, 65536..65537]);
        fill.filled(0..16384).unwrap();
        assert_eq!(fill.wants(Duration::ZERO), vec![65536..65537]);
        fill.filled(65536..131072).unwrap();
        assert_eq!(reader.join().unwrap(), Ok(()));
        assert_eq!(fill.wants(Duration::ZERO), Vec::<Range<u64>>::new());
    }

    #[test]
    fn the_end_of_a_fill_answers_every_waiting_read() {
        for (outcome, expected) in [
            (Outcome::Complete, Ok(())),
            (
                Outcome::Failed("glance unreachable".into()),
                Err(FillError::Failed("glance unreachable".into())),
            ),
        ] {
            let fill = Arc::new(Fill::new(100));
            let reader = {
                let fill = fill.clone();
                thread::spawn(move || fill.wait_filled(std::slice::from_ref(&(0..100)), LONG))
            };
            while fill.wants(LONG).is_empty() {}
            fill.finish(outcome.clone());
            assert_eq!(reader.join().unwrap(), expected);
            assert_eq!(fill.wants(Duration::ZERO), Vec::<Range<u64>>::new());
            assert_eq!(fill.progress().1, outcome);
        }
    }

    #[test]
    fn ranges_beyond_the_file_are_refused() {
        let fill = Fill::new(10);
        assert_eq!(fill.filled(5..11), Err(FillError::OutOfRange(5, 11, 10)));
        assert_eq!(
            fill.wait_filled(std::slice::from_ref(&(11..12)), SHORT),
            Err(FillError::OutOfRange(11, 12, 10))
        );
    }
}
