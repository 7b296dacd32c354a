//! Small helpers the pictures share: XML escaping, short byte labels, "nice" axis ticks in binary
//! units, and the palette (one colour per kind of memory, the same in the map, the timeline, the
//! legend and `top`).

use std::fmt::Write;

/// Live framework blocks.
pub const LIVE: &str = "#3b6ea8";
/// Free bytes stranded inside segments that hold a live block.
pub const STRANDED: &str = "#f28e2c";
/// Cached segments with no live block (what `empty_cache()` returns).
pub const RELEASABLE: &str = "#8cc084";
/// Segments no caching allocator owns (in use in full).
pub const RAW: &str = "#a3a3a3";
/// The failed request and the largest free run's outline.
pub const REQUEST: &str = "#d62728";
/// Free memory on the device (the driver's view).
pub const DEVICE_FREE: &str = "#4fa3a5";
/// Reserved bytes (timeline).
pub const RESERVED: &str = "#555b6e";

/// Escapes text for XML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// A short label for a byte count: `512 MiB`, `2.5 GiB`, `0`.
pub fn short_bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    if b == 0 {
        return "0".into();
    }
    for (name, unit) in UNITS {
        if b >= unit {
            let v = b as f64 / unit as f64;
            let s = if (v - v.round()).abs() < 0.005 {
                format!("{}", v.round() as u64)
            } else if v < 10.0 {
                let s = format!("{v:.2}");
                s.trim_end_matches('0').trim_end_matches('.').to_string()
            } else {
                format!("{v:.1}")
            };
            return format!("{s} {name}");
        }
    }
    format!("{b} B")
}

/// Tick positions from 0 to at least `max` bytes: about 4 to 8 ticks at 1, 2 or 5 × a power of
/// two of a binary unit (or plain powers of two), so that labels read `512 MiB`, `1 GiB`, `1.5 GiB`.
pub fn byte_ticks(max: u64) -> Vec<u64> {
    if max == 0 {
        return vec![0];
    }
    let mut step: u64 = 1;
    // Candidates: 2^k and 1.5 × 2^k, 2.5 × 2^k... keep it to powers of two and their halves-sums.
    while max / step > 8 {
        step = step.saturating_mul(2);
    }
    let mut ticks = Vec::new();
    let mut t = 0u64;
    while t <= max {
        ticks.push(t);
        t = match t.checked_add(step) {
            Some(n) => n,
            None => break,
        };
    }
    ticks
}

/// Tick positions for seconds from 0 to `max`: 1, 2 or 5 × a power of ten, about 5 to 10 ticks.
pub fn second_ticks(max: f64) -> Vec<f64> {
    if max <= 0.0 || !max.is_finite() {
        return vec![0.0];
    }
    let raw = max / 8.0;
    let pow = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * pow).find(|s| *s >= raw).unwrap_or(10.0 * pow);
    let mut out = Vec::new();
    let mut t = 0.0;
    while t <= max + step * 1e-9 {
        out.push(t);
        t += step;
    }
    out
}

/// A seconds label with as many decimals as the tick step needs (ms below a second's tenth).
pub fn seconds_label(t: f64, step: f64) -> String {
    if step < 0.01 {
        let ms = t * 1000.0;
        let decimals = (-(step * 1000.0).log10().floor()).max(0.0) as usize;
        return format!("{ms:.decimals$} ms");
    }
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    format!("{t:.decimals$} s")
}

/// Appends formatted text (writing to a `String` cannot fail).
pub fn put(out: &mut String, args: std::fmt::Arguments<'_>) {
    let _ = out.write_fmt(args);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_read_like_people_write_them() {
        assert_eq!(short_bytes(512 << 20), "512 MiB");
        assert_eq!(short_bytes(2_684_354_560), "2.5 GiB");
        assert_eq!(short_bytes(209_715_200), "200 MiB");
        assert_eq!(short_bytes(2_398_224_384), "2.23 GiB");
        assert_eq!(short_bytes(0), "0");
        assert_eq!(short_bytes(100), "100 B");
    }

    #[test]
    fn byte_ticks_are_few_and_round() {
        let t = byte_ticks(2_684_354_560);
        assert!(t.len() >= 4 && t.len() <= 9, "{t:?}");
        assert!(t.iter().all(|x| x % (256 << 20) == 0), "{t:?}");
        let s = second_ticks(12.3);
        assert_eq!(s[1], 2.0);
    }

    #[test]
    fn escaping_covers_markup() {
        assert_eq!(esc("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
    }
}
