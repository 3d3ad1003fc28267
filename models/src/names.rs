//! The naming rule shared by the registry, the fleet and manifests: a DNS
//! label (1-63 lowercase letters, digits and '-', not starting or ending with
//! '-'), because names end up in certificates, URLs and file names.

pub const NAME_RULE: &str =
    "use 1-63 lowercase letters, digits and '-', not starting or ending with '-'";

pub fn is_valid_name(value: &str) -> bool {
    (1..=63).contains(&value.len())
        && value
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-'))
        && !value.starts_with('-')
        && !value.ends_with('-')
}
