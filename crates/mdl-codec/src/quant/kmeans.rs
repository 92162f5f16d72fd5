//! Weighted k-means over key values, seeded deterministically.

/// A deterministic generator for k-means++ seeding (splitmix64).
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Weighted k-means in one dimension over `points` (ascending) with `weights`: k-means++ seeding
/// from a fixed seed, then Lloyd iterations; returns at most `k` centroids, ascending.
pub fn kmeans(points: &[f64], weights: &[f64], k: usize) -> Vec<f64> {
    if points.is_empty() || k == 0 {
        return Vec::new();
    }
    if points.len() <= k {
        return points.to_vec();
    }
    let mut rng = Rng(0x6d64_6c00_5155_414e);
    let pick = |scores: &[f64], rng: &mut Rng| {
        let total: f64 = scores.iter().sum();
        if total <= 0.0 {
            return None;
        }
        let mut r = rng.next_f64() * total;
        for (i, &s) in scores.iter().enumerate() {
            if r < s {
                return Some(i);
            }
            r -= s;
        }
        scores.iter().rposition(|&s| s > 0.0)
    };
    let mut centroids = vec![points[pick(weights, &mut rng).unwrap_or(0)]];
    let mut d2: Vec<f64> = points.iter().map(|&p| (p - centroids[0]).powi(2)).collect();
    while centroids.len() < k {
        let scores: Vec<f64> = d2.iter().zip(weights).map(|(d, w)| d * w).collect();
        let Some(i) = pick(&scores, &mut rng) else {
            break;
        };
        let c = points[i];
        centroids.push(c);
        for (d, &p) in d2.iter_mut().zip(points) {
            *d = d.min((p - c).powi(2));
        }
    }
    centroids.sort_by(f64::total_cmp);
    centroids.dedup();

    // Lloyd over sorted points with prefix sums: each cluster is a contiguous run between the
    // midpoints of neighbouring centroids.
    let mut pw = vec![0.0; points.len() + 1];
    let mut px = vec![0.0; points.len() + 1];
    for i in 0..points.len() {
        pw[i + 1] = pw[i] + weights[i];
        px[i + 1] = px[i] + weights[i] * points[i];
    }
    for _ in 0..100 {
        let mut next = centroids.clone();
        let mut lo = 0;
        for j in 0..centroids.len() {
            let hi = if j + 1 < centroids.len() {
                let mid = 0.5 * (centroids[j] + centroids[j + 1]);
                points.partition_point(|&p| p <= mid)
            } else {
                points.len()
            };
            let w = pw[hi] - pw[lo];
            if hi > lo && w > 0.0 {
                next[j] = (px[hi] - px[lo]) / w;
            }
            lo = hi;
        }
        next.sort_by(f64::total_cmp);
        if next == centroids {
            break;
        }
        centroids = next;
    }
    centroids.dedup();
    centroids
}
