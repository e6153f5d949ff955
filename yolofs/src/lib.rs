//! yolofs: the data plane of YOLO ("You Only Load Once").
//!
//! A VM reads only a few percent of its image while booting. yolofs keeps that read set, per base
//! file, as a *boot image* ([`format`]) learned from a real boot ([`recorder`], [`build`]), and
//! serves boot reads from memory through a read-only FUSE mirror of Nova's image cache ([`fs`],
//! [`fuse`]); reads outside the boot image pass through to the real file. [`store`] loads boot
//! images only once they are verified against their base file, [`pin`] keeps the hypervisor's own
//! files in page cache, and [`control`] is the JSON-lines socket Nova talks to, which also reports
//! host load ([`hostload`]) for the scheduler; [`metrics`] serves Prometheus metrics.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod build;
pub mod control;
pub mod fill;
pub mod format;
pub mod fs;
pub mod fuse;
pub mod hostload;
pub mod keeper;
pub mod lease;
pub mod metrics;
pub mod packed;
pub mod pin;
pub mod pool;
pub mod recorder;
pub mod stats;
pub mod store;
pub mod watch;
