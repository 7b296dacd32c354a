//! Human units for byte counts: GiB/MiB/KiB with two decimals, as PyTorch prints them.

/// `2684354560` → `"2.50 GiB"`.
pub fn human_bytes(b: u64) -> String {
    const KIB: f64 = 1024.0;
    let f = b as f64;
    if f >= KIB * KIB * KIB {
        format!("{:.2} GiB", f / (KIB * KIB * KIB))
    } else if f >= KIB * KIB {
        format!("{:.2} MiB", f / (KIB * KIB))
    } else if f >= KIB {
        format!("{:.2} KiB", f / KIB)
    } else {
        format!("{b} B")
    }
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
    fn parse_units() {
        assert_eq!(parse_bytes("12GiB"), Some(12 << 30));
        assert_eq!(parse_bytes("512MiB"), Some(512 << 20));
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("1.5G"), Some(3 << 29));
        assert_eq!(parse_bytes("lots"), None);
    }
}
