//! Size distributions: allocation sizes (recorded as events arrive) and free-run sizes (taken
//! from the map when a summary is made). Quantiles come from an hdrhistogram (3 significant
//! digits); the power-of-two buckets that fit GPU sizes (512 B … 64 GiB) are counted exactly
//! beside it, so exported bucket counts never depend on the histogram's quantisation.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Upper bounds of the exported buckets: 512 B, 1 KiB, … 64 GiB; a last bucket takes the rest.
pub const BUCKET_BOUNDS: [u64; 28] = {
    let mut b = [0u64; 28];
    let mut i = 0;
    while i < 28 {
        b[i] = 1u64 << (9 + i);
        i += 1;
    }
    b
};

/// The first bucket whose bound holds `v`: ⌈log2 v⌉ − 9, clamped (no scan over the bounds).
fn bucket_index(v: u64) -> usize {
    if v <= BUCKET_BOUNDS[0] {
        return 0;
    }
    let ceil_log2 = 64 - (v - 1).leading_zeros() as usize;
    (ceil_log2 - 9).min(BUCKET_BOUNDS.len())
}

/// A running distribution of byte sizes.
#[derive(Clone, Debug)]
pub struct SizeStats {
    hist: Histogram<u64>,
    buckets: [u64; 29],
    sum: u64,
    min: u64,
    max: u64,
}

impl Default for SizeStats {
    fn default() -> Self {
        #[allow(clippy::unwrap_used)] // constant, valid bounds
        let hist = Histogram::new_with_bounds(1, 1 << 44, 3).unwrap();
        SizeStats { hist, buckets: [0; 29], sum: 0, min: u64::MAX, max: 0 }
    }
}

impl SizeStats {
    /// Records one size.
    pub fn record(&mut self, v: u64) {
        self.hist.saturating_record(v.max(1));
        self.buckets[bucket_index(v)] += 1;
        self.sum = self.sum.saturating_add(v);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &SizeStats) {
        let _ = self.hist.add(&other.hist);
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a += b;
        }
        self.sum = self.sum.saturating_add(other.sum);
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// Number of values.
    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// The exported form.
    pub fn distribution(&self) -> Distribution {
        // The histogram's bucket midpoint, kept inside the exact range seen.
        let q = |x: f64| {
            if self.hist.is_empty() {
                0
            } else {
                self.hist.median_equivalent(self.hist.value_at_quantile(x)).clamp(self.min, self.max)
            }
        };
        let buckets = self
            .buckets
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &count)| Bucket { le: BUCKET_BOUNDS.get(i).copied().unwrap_or(u64::MAX), count })
            .collect();
        Distribution {
            count: self.hist.len(),
            sum: self.sum,
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            max: self.max,
            buckets,
        }
    }

    /// The distribution of `values`.
    pub fn of(values: impl IntoIterator<Item = u64>) -> SizeStats {
        let mut s = SizeStats::default();
        for v in values {
            s.record(v);
        }
        s
    }
}

/// One bucket: values in `(previous le, le]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    /// Inclusive upper bound in bytes (`u64::MAX` for the last).
    pub le: u64,
    /// Values in the bucket.
    pub count: u64,
}

/// A distribution as exported.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Distribution {
    /// Number of values.
    pub count: u64,
    /// Sum of values, bytes.
    pub sum: u64,
    /// Median (within 0.1 %).
    pub p50: u64,
    /// 90th percentile (within 0.1 %).
    pub p90: u64,
    /// 99th percentile (within 0.1 %).
    pub p99: u64,
    /// Largest value (exact).
    pub max: u64,
    /// Non-empty power-of-two buckets, exact counts.
    pub buckets: Vec<Bucket>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_count_each_value_once_and_exactly() {
        let d = SizeStats::of([512, 513, 1024, (1 << 30) + 1, 1 << 30]).distribution();
        assert_eq!(d.count, 5);
        assert_eq!(d.sum, 512 + 513 + 1024 + (1 << 31) + 1);
        assert_eq!(
            d.buckets,
            vec![Bucket { le: 512, count: 1 }, Bucket { le: 1024, count: 2 }, Bucket { le: 1 << 30, count: 1 }, Bucket { le: 1 << 31, count: 1 }]
        );
    }

    #[test]
    fn bucket_index_agrees_with_a_scan_of_the_bounds() {
        for v in [0u64, 1, 511, 512, 513, 1023, 1024, 1025, 3 << 20, (1 << 36) - 1, 1 << 36, (1 << 36) + 1, u64::MAX] {
            let scan = BUCKET_BOUNDS.iter().position(|&le| v <= le).unwrap_or(BUCKET_BOUNDS.len());
            assert_eq!(bucket_index(v), scan, "value {v}");
        }
    }

    #[test]
    fn empty_is_empty() {
        let d = SizeStats::default().distribution();
        assert_eq!((d.count, d.max, d.p50), (0, 0, 0));
        assert!(d.buckets.is_empty());
    }

    #[test]
    fn quantiles_of_one_size_are_that_size() {
        let d = SizeStats::of([500 << 20; 7]).distribution();
        assert_eq!((d.p50, d.p99, d.max), (500 << 20, 500 << 20, 500 << 20));
    }

    #[test]
    fn huge_values_land_in_the_last_bucket() {
        let d = SizeStats::of([1 << 40]).distribution();
        assert_eq!(d.buckets, vec![Bucket { le: u64::MAX, count: 1 }]);
    }
}
