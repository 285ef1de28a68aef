//! Guest side: the bench's own guest programs, the image, guest commands and
//! their results.

use std::path::{Path, PathBuf};
use std::process::Command;

use pvsched_vmtest::{GuestImage, ImageConfig};
use serde::{Deserialize, Serialize};

use crate::error::{guest, io, BenchError, Result};
use crate::host::cyclictest_args;
use crate::stats::Histogram;

/// The guest programs, compiled static at run time (`cc -O2 -static`).
pub const PROGRAMS: &[(&str, &str)] = &[
    ("audiosim", include_str!("../guest-progs/audiosim.c")),
    ("lockstress", include_str!("../guest-progs/lockstress.c")),
    ("pingpong", include_str!("../guest-progs/pingpong.c")),
    ("prodcons", include_str!("../guest-progs/prodcons.c")),
];

/// 64-bit FNV-1a, for the program cache key.
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.iter().chain(&(p.len() as u64).to_le_bytes()) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Compiles the guest programs into `cache/<hash>/` (reused while the
/// sources and the compiler stay the same) and returns their paths.
pub fn build_programs(cache: &Path) -> Result<Vec<PathBuf>> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let cc_version = Command::new(&cc)
        .arg("--version")
        .output()
        .map_err(io(format!("{cc} (C compiler for the guest programs)")))?
        .stdout;
    let mut out = Vec::new();
    for (name, src) in PROGRAMS {
        let key = fnv(&[name.as_bytes(), src.as_bytes(), cc.as_bytes(), &cc_version]);
        let dir = cache.join(format!("{key:016x}"));
        let bin = dir.join(name);
        if !bin.exists() {
            std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
            let c = dir.join(format!("{name}.c"));
            std::fs::write(&c, src).map_err(io(format!("writing {}", c.display())))?;
            let tmp = dir.join(format!("{name}.tmp-{}", std::process::id()));
            let o = Command::new(&cc)
                .args([
                    "-O2", "-static", "-pthread", "-Wall", "-Wextra", "-Werror", "-o",
                ])
                .arg(&tmp)
                .arg(&c)
                .output()
                .map_err(io(format!("running {cc}")))?;
            if !o.status.success() {
                return Err(BenchError::Tool {
                    what: format!("{cc} {name}.c"),
                    detail: format!(
                        "failed: {}{}",
                        String::from_utf8_lossy(&o.stdout),
                        String::from_utf8_lossy(&o.stderr)
                    ),
                });
            }
            std::fs::rename(&tmp, &bin).map_err(io(format!("renaming {}", tmp.display())))?;
        }
        out.push(bin);
    }
    Ok(out)
}

/// The vmtest image plus the bench's programs (as extra host binaries:
/// static, so no libraries come along).
///
/// Built once per run: guests booted again after a loss get the image the
/// run started with, whatever changed in the sources since (and inside the
/// KVM host VM, which only reads the image cache, no other could be built).
pub fn build_image(cache: &Path) -> Result<GuestImage> {
    static IMAGE: std::sync::Mutex<Option<GuestImage>> = std::sync::Mutex::new(None);
    let mut built = IMAGE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(image) = built.as_ref() {
        return Ok(image.clone());
    }
    let mut cfg = ImageConfig::default();
    cfg.binaries.extend(build_programs(&cache.join("progs"))?);
    let image = GuestImage::build(&cfg).map_err(guest("guest image"))?;
    *built = Some(image.clone());
    Ok(image)
}

/// Marks the line with cyclictest's JSON, gzipped and base64-encoded: it
/// travels over the serial console, a quarter of the bytes is worth it.
pub const CT_MARK: &str = "CTGZ ";

/// The shell command that runs cyclictest in the guest and prints its JSON
/// file as one [`CT_MARK`] line.
pub fn cyclictest_cmd(interval_us: u32, secs: u64, threads: usize, buckets: u32) -> String {
    format!(
        "cyclictest {} --json=/tmp/ct.json >/dev/null 2>/tmp/ct.err; rc=$?; cat /tmp/ct.err; \
         echo; echo \"{CT_MARK}$(gzip -c /tmp/ct.json | base64 | tr -d '\\n')\"; \
         rm -f /tmp/ct.json; exit $rc",
        cyclictest_args(interval_us, secs, threads, buckets).join(" ")
    )
}

/// Standard base64 (with or without padding); whitespace is skipped.
pub fn base64_decode(text: &str) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            b' ' | b'\n' | b'\r' | b'\t' => continue,
            _ => {
                return Err(BenchError::Parse {
                    what: "base64".into(),
                    msg: format!("unexpected byte {c:#04x}"),
                })
            }
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

/// `gzip -dc` of `data` (the host's gzip).
fn gunzip(data: Vec<u8>) -> Result<String> {
    use std::io::Write;
    let mut child = Command::new("gzip")
        .arg("-dc")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(io("starting gzip -dc"))?;
    let Some(mut stdin) = child.stdin.take() else {
        return Err(BenchError::Tool {
            what: "gzip -dc".into(),
            detail: "no stdin".into(),
        });
    };
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().map_err(io("running gzip -dc"))?;
    let _ = writer.join();
    if !out.status.success() {
        return Err(BenchError::Tool {
            what: "gzip -dc".into(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    String::from_utf8(out.stdout).map_err(|e| BenchError::Parse {
        what: "gzip -dc".into(),
        msg: e.to_string(),
    })
}

/// cyclictest's JSON from the guest command's output.
pub fn cyclictest_json(out: &str) -> Result<String> {
    let parse = |msg: &str| BenchError::Parse {
        what: "guest cyclictest".into(),
        msg: msg.into(),
    };
    let line = out
        .lines()
        .map(str::trim)
        .rfind(|l| l.starts_with(CT_MARK.trim_end()))
        .ok_or_else(|| parse("no cyclictest output line"))?;
    let b64 = line[CT_MARK.trim_end().len()..].trim();
    if b64.is_empty() {
        return Err(parse("cyclictest wrote no JSON"));
    }
    gunzip(base64_decode(b64)?)
}

/// The last line of `out` that looks like a JSON object.
pub fn last_json_line(out: &str) -> Option<&str> {
    out.lines()
        .map(str::trim)
        .rfind(|l| l.starts_with('{') && l.ends_with('}'))
}

/// What `audiosim` prints.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AudioResult {
    pub periods: u64,
    pub glitches: u64,
    pub skipped: u64,
    pub period_us: u64,
    pub buffer_us: u64,
    pub work_us: u64,
    pub late_avg_us: f64,
    pub late_p99_us: u64,
    pub late_max_us: u64,
}

/// What `pingpong` prints.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PingPongResult {
    pub round_trips: u64,
    pub avg_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// The last JSON line of a guest program's output `out`, as a `T`.
pub fn parse_line<T: for<'de> Deserialize<'de>>(what: &str, out: &str) -> Result<T> {
    let line = last_json_line(out).ok_or_else(|| BenchError::Parse {
        what: what.into(),
        msg: format!("no JSON in {out:?}"),
    })?;
    serde_json::from_str(line).map_err(|source| BenchError::Json {
        what: format!("{what} line {line:?}"),
        source,
    })
}

pub fn audiosim_cmd(secs: u64) -> String {
    format!("audiosim -d {secs}")
}

pub fn pingpong_cmd(secs: u64, guest_cpus: u32) -> String {
    let b = if guest_cpus >= 2 { 1 } else { 0 };
    format!("pingpong -d {secs} -n 20000 -a 0 -b {b}")
}

/// The histogram of a guest cyclictest run (`run`: its exit code and
/// output), its JSON kept as `<raw_dir>/<tag>-guest.json`.
pub(crate) fn guest_histogram(
    raw_dir: &std::path::Path,
    tag: &str,
    what: &str,
    run: std::result::Result<(i32, String), pvsched_vmtest::Error>,
) -> Result<Histogram> {
    let (rc, out) = run.map_err(guest(what))?;
    let json = cyclictest_json(&out);
    if let Ok(j) = &json {
        let _ = std::fs::write(raw_dir.join(format!("{tag}-guest.json")), j);
    }
    let json = match json {
        Ok(j) if rc == 0 => j,
        other => {
            return Err(BenchError::Tool {
                what: what.into(),
                detail: format!(
                    "exited {rc} ({}): {}",
                    other.err().map(|e| e.to_string()).unwrap_or_default(),
                    out.chars().take(500).collect::<String>()
                ),
            })
        }
    };
    Histogram::from_cyclictest_json(&json).map_err(|source| BenchError::Histogram {
        what: what.into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_json_line_skips_noise_before_and_after() {
        let out = "warning: x\n{\"a\":1}\n\n{\"b\":2}\ntrailer\n";
        assert_eq!(last_json_line(out), Some("{\"b\":2}"));
        assert_eq!(last_json_line("nothing"), None);
    }

    #[test]
    fn audiosim_output_parses() {
        let out = "{\"periods\":690,\"glitches\":3,\"skipped\":1,\"period_us\":2902,\"buffer_us\":2902,\"work_us\":300,\"late_avg_us\":41.4,\"late_p99_us\":82,\"late_max_us\":96}\n";
        let r: AudioResult = parse_line("audiosim", out).unwrap();
        assert_eq!((r.periods, r.glitches, r.skipped), (690, 3, 1));
    }

    #[test]
    fn pingpong_output_parses() {
        let out = "{\"round_trips\":4367,\"avg_us\":74.4,\"p50_us\":39.6,\"p99_us\":1173.3,\"max_us\":4689.8}";
        let r: PingPongResult = parse_line("pingpong", out).unwrap();
        assert_eq!(r.round_trips, 4367);
        assert_eq!(r.p99_us, 1173.3);
    }

    #[test]
    fn guest_cyclictest_command_fits_the_console() {
        let c = cyclictest_cmd(1000, 10, 2, 100_000);
        assert!(c.len() < pvsched_vmtest::MAX_COMMAND_LEN);
        assert!(c.contains("-p 8 --policy=rr -i 1000 -D 10 -t 2 -a -h 100000"));
        assert!(!c.chars().any(|c| c.is_control()));
    }

    #[test]
    fn base64_decodes_with_and_without_padding() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVsbG8").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVs\nbG8h").unwrap(), b"hello!");
        assert!(base64_decode("a*b").is_err());
    }

    #[test]
    fn cyclictest_json_comes_back_from_gzip_and_base64() {
        // Arrange: what `echo {"a":1} | gzip -c | base64` prints (made here
        // with the host's gzip, as the guest's busybox would).
        use std::io::Write;
        let mut gz = Command::new("gzip")
            .arg("-c")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        gz.stdin.take().unwrap().write_all(b"{\"a\":1}\n").unwrap();
        let bytes = gz.wait_with_output().unwrap().stdout;
        let out = format!("noise\n\n{CT_MARK}{}\n", encode(&bytes));

        // Act
        let json = cyclictest_json(&out).unwrap();

        // Assert
        assert_eq!(json.trim(), "{\"a\":1}");
        assert!(cyclictest_json("no marker").is_err());
        assert!(cyclictest_json(CT_MARK).is_err());
    }

    fn encode(data: &[u8]) -> String {
        const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut s = String::new();
        for chunk in data.chunks(3) {
            let n = chunk.len();
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let v = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= n {
                    s.push(A[((v >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    s.push('=');
                }
            }
        }
        s
    }

    #[test]
    fn program_cache_key_changes_with_the_source() {
        assert_ne!(fnv(&[b"a", b"bc"]), fnv(&[b"ab", b"c"]));
    }
}
