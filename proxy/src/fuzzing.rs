//! Entry points of the fuzz targets (`tests/fuzz`, cargo-fuzz with libFuzzer): the
//! hand-written parsers of the data path and the configuration loader, each run on
//! arbitrary bytes with the invariant its caller relies on checked here. A violated
//! invariant panics, which libFuzzer reports as a crash.
//!
//! They live in the crate, not in the targets, so that they compile and pass clippy with
//! every build, and so that the unit test below replays every seed and every crash kept in
//! `tests/fuzz/seeds` in `cargo test`: a crash found once stays a regression test. Hidden
//! from the docs: this is not an API.

use std::net::{IpAddr, Ipv4Addr};

use http::header::{self, HeaderName, HeaderValue};

use crate::config::Config;
use crate::plan::Plan;
use crate::proxy_protocol::{parse, Parsed};
use crate::rapid_reset::{FrameCursor, ResetWatch, OPEN_BUCKET};

/// Splits `data` into chunks whose sizes come from `sizes` (cycled; a zero is one byte),
/// as a socket might deliver it.
fn chunks<'a>(data: &'a [u8], sizes: &[u8]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < data.len() {
        let size = sizes
            .get(i % sizes.len().max(1))
            .map_or(data.len(), |s| usize::from(*s).max(1));
        let end = (at + size).min(data.len());
        out.push(&data[at..end]);
        at = end;
        i += 1;
    }
    out
}

/// The client's side of an HTTP/2 connection as the rapid-reset watch reads it. The first
/// byte is the reset budget, the next four the read sizes, the rest the bytes the client
/// sent. Invariants: however the bytes are split into reads, the watch counts the same
/// streams and resets and comes to the same verdict at the same frame, and it flags a
/// connection only when its premature resets are past the bound.
///
/// The watch reads the clock: a stream's age decides whether its reset is premature, in
/// buckets of `OPEN_BUCKET` since the watch began. Both watches here see every stream in
/// their first bucket unless the process stalls between them (seen when a fuzzing run was
/// paused with SIGSTOP for minutes: the same input then passes in every replay), so a run
/// that took a bucket or longer does not compare the two: the split is not what changed
/// the count.
pub fn h2_client_frames(data: &[u8]) {
    let [budget, s0, s1, s2, s3, rest @ ..] = data else {
        return;
    };
    let began = std::time::Instant::now();
    let budget = u64::from(*budget);
    let mut whole = ResetWatch::new(budget);
    let flagged_whole = whole.observe(rest);
    // As the connection's reader does: nothing is read past the flag.
    let mut split = ResetWatch::new(budget);
    let mut flagged_split = false;
    for chunk in chunks(rest, &[*s0, *s1, *s2, *s3]) {
        if split.observe(chunk) {
            flagged_split = true;
            break;
        }
    }
    if began.elapsed() < OPEN_BUCKET {
        assert_eq!(
            (whole.opened(), whole.premature()),
            (split.opened(), split.premature()),
            "the split changed what was counted"
        );
        assert_eq!(
            flagged_whole, flagged_split,
            "the split changed the verdict"
        );
    }
    assert_eq!(flagged_whole, whole.is_flood());
    if flagged_whole {
        assert!(whole.premature() * 2 > whole.opened().max(budget));
    }
}

/// The server's side of an HTTP/2 connection as the GOAWAY rewriter follows it: the first
/// four bytes are the write sizes, the rest the frames written. Invariants: the patched
/// stream has the same length, differs only in the error codes of GOAWAY frames (which
/// become ENHANCE_YOUR_CALM), and is the same however the writes were split.
pub fn h2_server_frames(data: &[u8]) {
    let [s0, s1, s2, s3, rest @ ..] = data else {
        return;
    };
    let patch_all = |pieces: Vec<&[u8]>| {
        let mut cursor = FrameCursor::default();
        let mut out = Vec::with_capacity(rest.len());
        for piece in pieces {
            let mut patches = Vec::new();
            cursor.advance(piece, Some(&mut patches));
            let at = out.len();
            out.extend_from_slice(piece);
            for (i, byte) in patches {
                assert!(i < piece.len(), "a patch outside the write");
                out[at + i] = byte;
            }
        }
        out
    };
    let whole = patch_all(vec![rest]);
    let split = patch_all(chunks(rest, &[*s0, *s1, *s2, *s3]));
    assert_eq!(whole.len(), rest.len());
    assert_eq!(whole, split, "the split changed the rewrite");
    // Walk the frames: only bytes 4..8 of a GOAWAY payload may differ.
    let mut at = 0;
    while at < rest.len() {
        if at + 9 > rest.len() {
            assert_eq!(whole[at..], rest[at..], "a partial header was changed");
            break;
        }
        let len = (usize::from(rest[at]) << 16)
            | (usize::from(rest[at + 1]) << 8)
            | usize::from(rest[at + 2]);
        let payload = at + 9;
        let end = (payload + len).min(rest.len());
        for i in at..end {
            let code = rest[at + 3] == 0x7 && (payload + 4..payload + 8).contains(&i);
            if code {
                assert_eq!(whole[i], 0xb_u32.to_be_bytes()[i - payload - 4]);
            } else {
                assert_eq!(whole[i], rest[i], "byte {i} changed outside a GOAWAY code");
            }
        }
        at = end;
    }
}

/// A PROXY protocol header (v1 or v2) as the listener reads it. Invariants: a complete
/// header's length is within the bytes; the header alone parses to the same result (it is
/// self-delimiting, so the listener can take exactly it and leave the ClientHello); and
/// every shorter prefix of it is incomplete, never invalid or complete (the listener reads
/// on while it is incomplete).
pub fn proxy_header(data: &[u8]) {
    match parse(data) {
        Parsed::Complete { len, client } => {
            assert!(
                len > 0 && len <= data.len(),
                "length {len} of {}",
                data.len()
            );
            match parse(&data[..len]) {
                Parsed::Complete { len: l, client: c } => {
                    assert_eq!((l, c), (len, client), "the header alone parses otherwise")
                }
                _ => panic!("the header alone does not parse"),
            }
            for cut in [0, 1, len / 2, len - 1] {
                if cut < len {
                    assert!(
                        matches!(parse(&data[..cut]), Parsed::Incomplete),
                        "a prefix of {cut} bytes of a {len}-byte header is not incomplete"
                    );
                }
            }
        }
        Parsed::Incomplete | Parsed::Invalid(_) => {}
    }
}

/// A client's request head as the forwarder rewrites it. The first byte picks h2c or
/// HTTP/1.1 upstream, whether the peer is a trusted proxy and the method; then lines of
/// `name: value` (the first line the request target). Invariants: no hop-by-hop header
/// reaches the upstream (nor any the client's Connection header named, but those the
/// proxy sets itself), TE only as `trailers` and only to h2c, Host exactly where the
/// upstream protocol wants it, X-Forwarded-Proto https, X-Forwarded-For ending with the
/// peer.
pub fn request_head(data: &[u8]) {
    let [flags, rest @ ..] = data else {
        return;
    };
    let use_h2c = flags & 1 != 0;
    let trusted = flags & 2 != 0;
    let method = [http::Method::GET, http::Method::POST, http::Method::PUT]
        [usize::from(flags >> 2) % 3]
        .clone();
    let mut lines = rest.split(|b| *b == b'\n');
    let target = lines.next().unwrap_or_default();
    let uri = http::Uri::try_from(target).unwrap_or_else(|_| http::Uri::from_static("/"));
    let mut req = http::Request::builder()
        .method(method)
        .uri(uri)
        .body(())
        .expect("a request");
    *req.version_mut() = if use_h2c {
        http::Version::HTTP_2
    } else {
        http::Version::HTTP_11
    };
    for line in lines {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
        ) else {
            continue;
        };
        req.headers_mut().append(name, value);
    }
    let (mut parts, ()) = req.into_parts();
    let named_by_connection = crate::http::connection_named(&parts.headers);
    let had_te_trailers = parts
        .headers
        .get_all(header::TE)
        .iter()
        .any(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    let peer = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7));
    let peer_ip = HeaderValue::from_str(&peer.to_string()).expect("an address");
    let first_node = http::uri::Authority::from_static("127.0.0.1:6333");
    crate::http::rewrite_head(&mut parts, use_h2c, &first_node, &peer_ip, trusted);

    let h = &parts.headers;
    for name in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ] {
        assert!(!h.contains_key(name), "{name} reached the upstream");
    }
    let set_by_proxy = ["te", "host", "x-forwarded-for", "x-forwarded-proto"];
    for name in &named_by_connection {
        if !set_by_proxy.contains(&name.as_str()) {
            assert!(
                !h.contains_key(name),
                "{name}, named by Connection, reached the upstream"
            );
        }
    }
    let te: Vec<_> = h.get_all(header::TE).iter().collect();
    if use_h2c && had_te_trailers {
        assert_eq!(te, [&HeaderValue::from_static("trailers")]);
    } else {
        assert!(te.is_empty(), "TE reached the upstream: {te:?}");
    }
    if use_h2c {
        assert!(
            !h.contains_key(header::HOST),
            "Host beside :authority on h2c"
        );
        assert_eq!(parts.version, http::Version::HTTP_2);
    } else {
        assert!(h.contains_key(header::HOST), "no Host on HTTP/1.1");
        assert_eq!(parts.version, http::Version::HTTP_11);
    }
    assert_eq!(h.get_all("x-forwarded-proto").iter().count(), 1);
    assert_eq!(h["x-forwarded-proto"], "https");
    let xff = h.get_all("x-forwarded-for").iter().collect::<Vec<_>>();
    assert_eq!(xff.len(), 1, "one X-Forwarded-For");
    assert!(xff[0].as_bytes().ends_with(peer_ip.as_bytes()));
    if !trusted {
        assert_eq!(
            xff[0], &peer_ip,
            "an untrusted peer's own X-Forwarded-For was kept"
        );
        assert!(!h.contains_key(header::FORWARDED) && !h.contains_key("x-real-ip"));
    }
}

/// A configuration file as the loader reads it. Invariants: text that parses is checked
/// without a panic (every problem an error), and renders (as `check-config` prints it) to
/// TOML that parses back to the same rendering.
pub fn config_text(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = toml::from_str::<Config>(text) else {
        return;
    };
    let _ = Plan::new(&config);
    let rendered = config.to_toml();
    let again: Config = toml::from_str(&rendered)
        .unwrap_or_else(|e| panic!("the rendering does not parse: {e}\n{rendered}"));
    assert_eq!(
        again.to_toml(),
        rendered,
        "the rendering does not round-trip"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every seed and every crash kept for a target, replayed: the targets' invariants
    /// hold on all of them in every `cargo test`, not only under the fuzzer.
    #[test]
    fn every_kept_seed_and_crash_passes() {
        let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fuzz/seeds");
        type Target = fn(&[u8]);
        let targets: [(&str, Target); 5] = [
            ("h2_client_frames", h2_client_frames),
            ("h2_server_frames", h2_server_frames),
            ("proxy_header", proxy_header),
            ("request_head", request_head),
            ("config_text", config_text),
        ];
        for (target, run) in targets {
            let dir = seeds.join(target);
            let mut n = 0;
            for entry in
                std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            {
                let path = entry.expect("entry").path();
                let data = std::fs::read(&path).expect("seed");
                run(&data);
                n += 1;
            }
            assert!(n > 0, "no seeds for {target} in {}", dir.display());
        }
    }
}
