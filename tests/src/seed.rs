//! Records written straight into a store, for benchmarks that need a big
//! fleet without enrolling it (`wave-writes`, `console-pages`).

use std::collections::BTreeMap;

use edgeloop_control_plane::fleet::members::{Member, MemberKind};
use edgeloop_models::Digest;
use time::OffsetDateTime;

/// An enrolled device as the store keeps it, seen at `now`.
pub fn device(id: &str, labels: BTreeMap<String, String>, now: OffsetDateTime) -> Member {
    Member {
        labels,
        ..Member::enrolled(
            id,
            MemberKind::Device,
            Digest::of(id.as_bytes()),
            now + time::Duration::days(365),
            now,
        )
    }
}
