//! Human units for byte counts: GiB/MiB/KiB with two decimals, as PyTorch prints them
//! (`format_size` in c10/cuda/CUDACachingAllocator.cpp: a unit is used only above one whole of
//! it, so exactly 1 GiB is "1024.00 MiB", as in PyTorch's OOM message), so that a figure gpufrag
//! prints can be matched with PyTorch's text; and exact counts with thousands separators.

/// `2684354560` → `"2.50 GiB"`, `1073741824` → `"1024.00 MiB"`, `1024` → `"1024 B"`.
pub fn human_bytes(b: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = KIB * KIB;
    const GIB: u64 = MIB * KIB;
    let f = b as f64;
    if b > GIB {
        format!("{:.2} GiB", f / GIB as f64)
    } else if b > MIB {
        format!("{:.2} MiB", f / MIB as f64)
    } else if b > KIB {
        format!("{:.2} KiB", f / KIB as f64)
    } else {
        format!("{b} B")
    }
}

/// `2684354560` → `"2,684,354,560"`: exact byte counts with thousands separators.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Parses `12GiB`, `512MiB`, `1.5G`, `4096` (bytes) into bytes.
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let v = n * mult;
    (v.is_finite() && v >= 0.0 && v < u64::MAX as f64).then_some(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_matches_pytorch_style() {
        assert_eq!(human_bytes(2_684_354_560), "2.50 GiB");
        assert_eq!(human_bytes(2_398_224_384), "2.23 GiB");
        assert_eq!(human_bytes(2_097_152_000), "1.95 GiB");
        assert_eq!(human_bytes(209_715_200), "200.00 MiB");
        assert_eq!(human_bytes(100), "100 B");
    }

    #[test]
    fn unit_boundaries_follow_pytorch_format_size() {
        assert_eq!(human_bytes(1 << 30), "1024.00 MiB");
        assert_eq!(human_bytes((1 << 30) + 1), "1.00 GiB");
        assert_eq!(human_bytes(1 << 20), "1024.00 KiB");
        assert_eq!(human_bytes(1024), "1024 B");
        assert_eq!(human_bytes(1025), "1.00 KiB");
        assert_eq!(human_bytes(0), "0 B");
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(12), "12");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(2_684_354_560), "2,684,354,560");
    }

    #[test]
    fn parse_units() {
        assert_eq!(parse_bytes("12GiB"), Some(12 << 30));
        assert_eq!(parse_bytes("512MiB"), Some(512 << 20));
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("1.5G"), Some(3 << 29));
        assert_eq!(parse_bytes("lots"), None);
    }
}
