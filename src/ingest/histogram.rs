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

/// Values kept one by one before a histogram is made: a histogram of 1 B … 16 TiB at 3 digits
/// holds about 290 KB of counters, so a process with a handful of allocations (a record file of
/// 10,000 processes) would cost far more than its events. Below this many values the values
/// themselves are kept (at most 32 KB), and quantiles come from a histogram built for the moment.
pub const EXACT_VALUES: usize = 4096;

/// A running distribution of byte sizes.
#[derive(Clone, Debug)]
pub struct SizeStats {
    /// The values, while there are at most [`EXACT_VALUES`] of them and `hist` is `None`.
    values: Vec<u64>,
    hist: Option<Box<Histogram<u64>>>,
    buckets: [u64; 29],
    sum: u64,
    min: u64,
    max: u64,
}

fn new_histogram() -> Histogram<u64> {
    #[allow(clippy::unwrap_used)] // constant, valid bounds
    Histogram::new_with_bounds(1, 1 << 44, 3).unwrap()
}

impl Default for SizeStats {
    fn default() -> Self {
        SizeStats { values: Vec::new(), hist: None, buckets: [0; 29], sum: 0, min: u64::MAX, max: 0 }
    }
}

impl SizeStats {
    /// Records one size.
    pub fn record(&mut self, v: u64) {
        match &mut self.hist {
            Some(h) => {
                h.saturating_record(v.max(1));
            }
            None if self.values.len() < EXACT_VALUES => self.values.push(v),
            None => {
                let mut h = self.histogram();
                h.saturating_record(v.max(1));
                self.hist = Some(Box::new(h));
                self.values = Vec::new();
            }
        }
        self.buckets[bucket_index(v)] += 1;
        self.sum = self.sum.saturating_add(v);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    /// The values as a histogram (a copy, or one built from the values kept).
    fn histogram(&self) -> Histogram<u64> {
        match &self.hist {
            Some(h) => (**h).clone(),
            None => {
                let mut h = new_histogram();
                for &v in &self.values {
                    h.saturating_record(v.max(1));
                }
                h
            }
        }
    }

    /// The `q` quantile as the histogram reports it (`median_equivalent(value_at_quantile(q))`),
    /// computed from the kept values without building a histogram: the value of rank
    /// ⌈q·n⌉ (at least 1), reported as the midpoint of its 3-digit equivalence range.
    fn quantile(&self, q: f64, sorted: &[u64], eq: &Histogram<u64>) -> u64 {
        if let Some(h) = &self.hist {
            return if h.is_empty() { 0 } else { h.median_equivalent(h.value_at_quantile(q)).clamp(self.min, self.max) };
        }
        if sorted.is_empty() {
            return 0;
        }
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        let v = sorted[rank - 1].clamp(1, 1 << 44);
        eq.median_equivalent(v).clamp(self.min, self.max)
    }

    /// Adds every value of `other`: O(its values) while it keeps them, O(histogram) otherwise.
    pub fn merge(&mut self, other: &SizeStats) {
        if self.hist.is_none() && other.hist.is_none() && self.values.len() + other.values.len() <= EXACT_VALUES {
            self.values.extend_from_slice(&other.values);
        } else {
            let h = self.hist.get_or_insert_with(|| {
                let mut h = new_histogram();
                for &v in &self.values {
                    h.saturating_record(v.max(1));
                }
                Box::new(h)
            });
            self.values = Vec::new();
            match &other.hist {
                Some(o) => {
                    let _ = h.add(&**o);
                }
                None => {
                    for &v in &other.values {
                        h.saturating_record(v.max(1));
                    }
                }
            }
        }
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a += b;
        }
        self.sum = self.sum.saturating_add(other.sum);
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// Number of values.
    pub fn count(&self) -> u64 {
        self.hist.as_ref().map_or(self.values.len() as u64, |h| h.len())
    }

    /// The exported form.
    pub fn distribution(&self) -> Distribution {
        // The histogram's bucket midpoint, kept inside the exact range seen.
        let mut sorted = if self.hist.is_none() { self.values.clone() } else { Vec::new() };
        sorted.sort_unstable();
        // Only its equivalence ranges are used (they depend on the precision, not the bounds).
        #[allow(clippy::unwrap_used)] // constant, valid bounds
        let eq = Histogram::<u64>::new_with_bounds(1, 2, 3).unwrap();
        let q = |x: f64| self.quantile(x, &sorted, &eq);
        let buckets = self
            .buckets
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &count)| Bucket { le: BUCKET_BOUNDS.get(i).copied().unwrap_or(u64::MAX), count })
            .collect();
        Distribution { count: self.count(), sum: self.sum, p50: q(0.5), p90: q(0.9), p99: q(0.99), max: self.max, buckets }
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
            vec![
                Bucket { le: 512, count: 1 },
                Bucket { le: 1024, count: 2 },
                Bucket { le: 1 << 30, count: 1 },
                Bucket { le: 1 << 31, count: 1 }
            ]
        );
    }

    #[test]
    fn bucket_index_agrees_with_a_scan_of_the_bounds() {
        for v in [0u64, 1, 511, 512, 513, 1023, 1024, 1025, 3 << 20, (1 << 36) - 1, 1 << 36, (1 << 36) + 1, u64::MAX] {
            let scan = BUCKET_BOUNDS.iter().position(|&le| v <= le).unwrap_or(BUCKET_BOUNDS.len());
            assert_eq!(bucket_index(v), scan, "value {v}");
        }
    }

    /// Issue 14: a record file of 10,000 processes took 5.8 GB, two histograms of about 290 KB
    /// each per process. Few values keep no histogram; many switch to one with the same figures.
    #[test]
    fn regression_few_values_keep_no_histogram_and_many_give_the_same_distribution() {
        let few = SizeStats::of([512, 4096, 1 << 20]);
        assert!(few.hist.is_none() && few.values.len() == 3);
        let values: Vec<u64> = (0..3 * EXACT_VALUES as u64).map(|i| 512 + i * 4099 % 100_000).collect();
        let many = SizeStats::of(values.iter().copied());
        assert!(many.hist.is_some() && many.values.is_empty());
        let mut reference = new_histogram();
        for &v in &values {
            reference.record(v).unwrap();
        }
        let d = many.distribution();
        assert_eq!(d.count, values.len() as u64);
        assert_eq!(d.p50, reference.median_equivalent(reference.value_at_quantile(0.5)));
        // Few values: the same quantiles as a histogram of them.
        for n in [1usize, 2, 7, 100, EXACT_VALUES] {
            let few = SizeStats::of(values[..n].iter().copied());
            let mut h = new_histogram();
            for &v in &values[..n] {
                h.record(v).unwrap();
            }
            for q in [0.5, 0.9, 0.99] {
                let want = h.median_equivalent(h.value_at_quantile(q)).clamp(few.min, few.max);
                assert_eq!(
                    few.quantile(
                        q,
                        &{
                            let mut s = values[..n].to_vec();
                            s.sort_unstable();
                            s
                        },
                        &Histogram::new_with_bounds(1, 2, 3).unwrap()
                    ),
                    want,
                    "n {n} q {q}"
                );
            }
        }
        let mut merged = SizeStats::of(values[..10].iter().copied());
        merged.merge(&SizeStats::of(values[10..].iter().copied()));
        assert_eq!(merged.distribution(), d);
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
