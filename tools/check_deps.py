#!/usr/bin/env python3
"""The dependency graph's rules, checked offline from `cargo metadata`
(what `cargo deny check licenses bans` would check, without a tool to
install or an advisory database to fetch):

- every crate's licence is one we may ship: its SPDX expression holds with
  the allowed licences (OR: one side suffices; AND: both must hold);
- no banned crate is in the graph (OpenSSL and aws-lc: rustls with ring
  is the one TLS stack, see ARCHITECTURE.md);
- two semver-incompatible versions of one crate appear only where listed
  below, with the reason; a new one fails, so a duplicate is a decision.

Usage: tools/check_deps.py  (from the workspace; exit 1 on a violation)
"""
import json
import re
import subprocess
import sys

ALLOWED_LICENSES = {
    "MIT", "MIT-0", "Apache-2.0", "Apache-2.0 WITH LLVM-exception", "BSD-2-Clause",
    "BSD-3-Clause", "ISC", "Zlib", "Unicode-3.0", "Unicode-DFS-2016", "CC0-1.0",
    "BSL-1.0", "Unlicense", "0BSD", "CDLA-Permissive-2.0", "MPL-2.0",
}
BANNED = {
    "openssl": "OpenSSL; rustls with ring is the TLS stack",
    "openssl-sys": "OpenSSL; rustls with ring is the TLS stack",
    "native-tls": "the platform TLS (OpenSSL on Linux)",
    "aws-lc-rs": "aws-lc; ring is the crypto provider",
    "aws-lc-sys": "aws-lc; ring is the crypto provider",
}
# Crates that appear at two incompatible versions, and why that is accepted.
DUPLICATES_ALLOWED = {
    # Ours could move; the other major comes with a dependency we pin.
    "base64": "ours and kube's 0.22; hyper-util, pem and reqwest 0.23",
    "rand": "ours and candle's 0.9; proptest (tests only) 0.10",
    "rand_core": "follows rand (0.9, 0.10) and signature (0.6)",
    "zip": "ours 2 (read-only npz); candle-core 7",
    # Pulled in by pinned dependencies: nothing of ours crosses them.
    "parking_lot": "sled 0.34 (the embedded store) 0.11; tokio 0.12",
    "parking_lot_core": "follows parking_lot",
    "redox_syscall": "follows parking_lot_core (never built on Linux)",
    "bitflags": "redox_syscall 0.2 (never built on Linux) 1",
    "thiserror": "protobuf 3.7 (the ONNX IR codegen) 1; everything else 2",
    "thiserror-impl": "follows thiserror",
    "syn": "a few derive crates still on 2",
    "synstructure": "asn1-rs-derive 0.13; yoke and zerofrom 0.14",
    "prettyplease": "tonic-build 0.2; prost-build 0.3 (build time only)",
    "getrandom": "ring and rand_core 0.6 on 0.2, ahash 0.3, rand 0.10 on 0.4",
    "r-efi": "follows getrandom (UEFI only)",
    "miniz_oxide": "png 0.18 (the console's sample images) 0.8; flate2 (zip) 0.9: deflate inside each, no types cross",
    "hashbrown": "petgraph, safetensors and indexmap each pin their own",
    "foldhash": "follows hashbrown",
    "cpufeatures": "sha2 and curve25519-dalek 0.2; chacha20 0.3",
    "bit-vec": "yasna (rcgen) 0.9; proptest (tests only) 0.10",
    "linux-raw-sys": "follows rustix",
    "rustix": "which (0.38); tempfile (1)",
    "pem": "kube-client 3; rcgen 4",
    "toml_datetime": "toml and toml_edit each pin their own",
    "winnow": "toml and toml_edit each pin their own",
    "unicode-width": "miette (protox's errors) 0.1; indicatif 0.2",
    "windows-sys": "Windows only",
    # object_store 0.14 (the S3 artifact store) signs Content-MD5 with md-5
    # 0.11 on the RustCrypto 0.11 traits; everything else (sha2, ed25519)
    # is on 0.10. object_store 0.13 would instead pull a second reqwest,
    # hyper-rustls and rustls-platform-verifier (ARCHITECTURE.md).
    "digest": "ours (sha2) 0.10; md-5 0.11 under object_store 0.14",
    "block-buffer": "follows digest",
    "crypto-common": "follows digest",
    # postgres-protocol 0.6.10 (held there, so that the store stays on
    # sha2 0.10 and hmac 0.12) hashes passwords with md-5 0.10.
    "md-5": "0.10 under postgres-protocol 0.6.10; 0.11 under object_store 0.14",
}


def holds(expr: str) -> bool:
    """Whether an SPDX expression holds with ALLOWED_LICENSES."""
    expr = expr.replace("/", " OR ").strip()
    tokens = re.findall(r"\(|\)|[A-Za-z0-9.\-+]+(?: WITH [A-Za-z0-9.\-+]+)?", expr)
    pos = 0

    def parse_or():
        nonlocal pos
        value = parse_and()
        while pos < len(tokens) and tokens[pos] == "OR":
            pos += 1
            value = parse_and() or value
        return value

    def parse_and():
        nonlocal pos
        value = parse_atom()
        while pos < len(tokens) and tokens[pos] == "AND":
            pos += 1
            value = parse_atom() and value
        return value

    def parse_atom():
        nonlocal pos
        token = tokens[pos]
        pos += 1
        if token == "(":
            value = parse_or()
            pos += 1  # ")"
            return value
        return token in ALLOWED_LICENSES

    return parse_or()


def major(version: str) -> str:
    parts = version.split("+")[0].split("-")[0].split(".")
    for i, p in enumerate(parts):
        if p != "0":
            return ".".join(parts[: i + 1])
    return version


def self_test() -> int:
    table = [
        ("MIT", True), ("MIT OR Apache-2.0", True), ("MIT/Apache-2.0", True),
        ("Apache-2.0 AND ISC", True), ("(MIT OR GPL-2.0) AND BSD-3-Clause", True),
        ("GPL-3.0", False), ("MIT AND GPL-2.0", False), ("GPL-2.0 OR LGPL-3.0", False),
        ("Apache-2.0 WITH LLVM-exception OR MIT", True), ("(GPL-2.0 AND MIT) OR ISC", True),
    ]
    bad = [(e, w) for e, w in table if holds(e) != w]
    for e, w in bad:
        print(f"check_deps self-test: holds({e!r}) should be {w}", file=sys.stderr)
    assert major("0.9.3") == "0.9" and major("1.2.0") == "1" and major("0.0.4") == "0.0.4"
    return 1 if bad else 0


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--locked"],
            check=True, capture_output=True, text=True,
        ).stdout
    )
    workspace = set(meta["workspace_members"])
    reachable = {n["id"] for n in meta["resolve"]["nodes"]}
    problems = []
    versions = {}
    for pkg in meta["packages"]:
        if pkg["id"] not in reachable or pkg["id"] in workspace:
            continue
        name, version = pkg["name"], pkg["version"]
        versions.setdefault(name, set()).add(major(version))
        lic = pkg.get("license")
        if not lic:
            problems.append(f"{name} {version}: no licence in its metadata")
        elif not holds(lic):
            problems.append(f"{name} {version}: licence {lic!r} is not allowed")
        if name in BANNED:
            problems.append(f"{name} {version}: banned ({BANNED[name]})")
    duplicates = {n: sorted(v) for n, v in versions.items() if len(v) > 1}
    for name, majors in sorted(duplicates.items()):
        if name not in DUPLICATES_ALLOWED:
            problems.append(f"{name}: versions {', '.join(majors)} in the graph (two majors)")
    for name in sorted(set(DUPLICATES_ALLOWED) - set(duplicates)):
        problems.append(f"{name}: listed in DUPLICATES_ALLOWED but no longer duplicated; drop the entry")
    checked = len(versions)
    if problems:
        print(f"check_deps: {len(problems)} problem(s) in {checked} crates:", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 1
    print(f"check_deps: {checked} crates: licences allowed, none banned, "
          f"{len(duplicates)} accepted duplicate(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
