//! Reading the Prometheus text exposition, and the histogram arithmetic Prometheus does on
//! it: the one parser and the one `histogram_quantile` that the operator's direct scraper,
//! the simulator and the engine's benchmark share, so none computes a p99 its own way.
//!
//! Invariants: a line that is not a well-formed sample (comments, `# TYPE`, garbage) is
//! skipped, never an error; label values are unescaped (`\\`, `\"`, `\n`); a cumulative
//! histogram is a list of `(upper bound, count)` pairs in ascending bound order with `+Inf`
//! last, and [`histogram_quantile`] interpolates exactly as Prometheus' does.

use std::borrow::Cow;
use std::collections::BTreeMap;

/// One sample line: `name{k="v",…} value [timestamp]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    pub labels: Vec<(&'a str, Cow<'a, str>)>,
    pub value: f64,
}

impl Sample<'_> {
    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_ref())
    }
}

/// The samples of an exposition, in order; lines that are not samples are skipped.
pub fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    text.lines().filter_map(parse_line)
}

/// Parses one sample line.
pub fn parse_line(line: &str) -> Option<Sample<'_>> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(inner)?;
        labels = parsed;
        rest = after;
    }
    let value = parse_value(rest.split_whitespace().next()?)?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

fn parse_value(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        other => other.parse().ok(),
    }
}

type Labels<'a> = Vec<(&'a str, Cow<'a, str>)>;

/// `k="v",k2="v2"}` → the labels and what follows the closing brace.
fn parse_labels(mut s: &str) -> Option<(Labels<'_>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([' ', ',']);
        if let Some(after) = s.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim();
        let body = s[eq + 1..].trim_start().strip_prefix('"')?;
        let (value, after) = quoted(body)?;
        labels.push((key, value));
        s = after;
    }
}

/// The text up to the closing quote, unescaped, and what follows it.
fn quoted(s: &str) -> Option<(Cow<'_, str>, &str)> {
    let bytes = s.as_bytes();
    let mut i = 0;
    let mut escaped = false;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => {
                escaped = true;
                i += 2;
                continue;
            }
            b'"' => break,
            _ => i += 1,
        }
    }
    let raw = s.get(..i)?;
    let after = s.get(i + 1..)?;
    if !escaped {
        return Some((Cow::Borrowed(raw), after));
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => {}
        }
    }
    Some((Cow::Owned(out), after))
}

/// The cumulative histogram of the `series` (a `_bucket` name) samples that `keep` accepts,
/// summed over their label sets by `le`: what `sum by (le) (…)` gives.
pub fn cumulative_buckets<'a>(
    samples: impl IntoIterator<Item = &'a Sample<'a>>,
    series: &str,
    keep: impl Fn(&Sample<'_>) -> bool,
) -> Vec<(f64, f64)> {
    // Keyed by the bound's bits: for non-negative bounds their order is the bounds' order.
    let mut by_le: BTreeMap<u64, f64> = BTreeMap::new();
    for s in samples {
        if s.name != series || !keep(s) {
            continue;
        }
        if let Some(le) = s.label("le").and_then(parse_value) {
            *by_le.entry(le.to_bits()).or_default() += s.value;
        }
    }
    by_le
        .into_iter()
        .map(|(bits, c)| (f64::from_bits(bits), c))
        .collect()
}

/// The observations between two cumulative histograms, per bucket (still cumulative): what
/// `increase()` of each `_bucket` series gives. A bucket absent from `prev` counts from 0.
pub fn bucket_deltas(prev: &[(f64, f64)], cur: &[(f64, f64)]) -> Vec<(f64, f64)> {
    cur.iter()
        .map(|(le, c)| {
            let before = prev.iter().find(|(l, _)| l == le).map_or(0.0, |(_, c)| *c);
            (*le, (c - before).max(0.0))
        })
        .collect()
}

/// Cumulative pairs from per-bucket counts over `bounds` (one more count than bounds: the
/// last is the `+Inf` bucket).
pub fn cumulative_from_counts(bounds: &[f64], counts: &[u64]) -> Vec<(f64, f64)> {
    let mut total = 0.0;
    bounds
        .iter()
        .copied()
        .chain(std::iter::once(f64::INFINITY))
        .zip(counts)
        .map(|(le, c)| {
            total += *c as f64;
            (le, total)
        })
        .collect()
}

/// Prometheus' `histogram_quantile(q, …)` over a cumulative histogram: the first bucket
/// whose count reaches q × total, interpolated linearly within it (from 0 for the first
/// bucket); a rank in the `+Inf` bucket gives the highest finite bound. None when nothing
/// was observed (Prometheus' NaN).
pub fn histogram_quantile(q: f64, cumulative: &[(f64, f64)]) -> Option<f64> {
    let total = cumulative.last()?.1;
    if total <= 0.0 || total.is_nan() {
        return None;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for &(le, count) in cumulative {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower);
            }
            let in_bucket = count - below;
            let frac = if in_bucket > 0.0 {
                (rank - below) / in_bucket
            } else {
                1.0
            };
            return Some(lower + (le - lower) * frac);
        }
        lower = le;
        below = count;
    }
    Some(lower)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_labels_values_and_skips_the_rest() {
        let text = "# HELP x X.\n# TYPE x counter\nx_total 3\n\
                    y{tier=\"gold\",le=\"+Inf\"} 5 1700000000\n\
                    z{a=\"q\\\"uo,te\",b=\"x\"} -Inf\nnot a sample\n\n";
        let s: Vec<Sample> = samples(text).collect();
        assert_eq!(s.len(), 3, "{s:?}");
        assert_eq!((s[0].name, s[0].value), ("x_total", 3.0));
        assert_eq!(s[1].label("le"), Some("+Inf"));
        assert_eq!(s[1].label("tier"), Some("gold"));
        assert_eq!(s[2].label("a"), Some("q\"uo,te"));
        assert_eq!(s[2].label("b"), Some("x"));
        assert_eq!(s[2].value, f64::NEG_INFINITY);
    }

    #[test]
    fn buckets_are_summed_by_le_over_label_sets() {
        let text = "h_bucket{tier=\"a\",le=\"0.1\"} 10\nh_bucket{tier=\"a\",le=\"1.0\"} 18\n\
                    h_bucket{tier=\"a\",le=\"+Inf\"} 20\nh_bucket{tier=\"b\",le=\"0.1\"} 5\n\
                    h_bucket{tier=\"b\",le=\"1.0\"} 5\nh_bucket{tier=\"b\",le=\"+Inf\"} 5\n";
        let s: Vec<Sample> = samples(text).collect();
        let all = cumulative_buckets(&s, "h_bucket", |_| true);
        assert_eq!(all, vec![(0.1, 15.0), (1.0, 23.0), (f64::INFINITY, 25.0)]);
        let b = cumulative_buckets(&s, "h_bucket", |x| x.label("tier") == Some("b"));
        assert_eq!(b, vec![(0.1, 5.0), (1.0, 5.0), (f64::INFINITY, 5.0)]);
    }

    #[test]
    fn quantile_interpolates_like_prometheus() {
        // 98 at ≤ 5 ms, 2 in (0.5, 1]: rank 99 is halfway into the (0.5, 1] bucket.
        let bounds = [0.005, 0.5, 1.0];
        let c = cumulative_from_counts(&bounds, &[98, 0, 2, 0]);
        let p99 = histogram_quantile(0.99, &c).expect("data");
        assert!((p99 - 0.75).abs() < 1e-9, "{p99}");
        // A rank in the +Inf bucket is the highest finite bound.
        let c = cumulative_from_counts(&bounds, &[1, 0, 0, 9]);
        assert_eq!(histogram_quantile(0.99, &c), Some(1.0));
        // In the first bucket, from 0.
        let c = cumulative_from_counts(&bounds, &[100, 0, 0, 0]);
        assert!((histogram_quantile(0.5, &c).expect("data") - 0.0025).abs() < 1e-12);
        assert_eq!(
            histogram_quantile(0.99, &cumulative_from_counts(&bounds, &[0; 4])),
            None
        );
        assert_eq!(histogram_quantile(0.99, &[]), None);
    }

    #[test]
    fn deltas_are_per_bucket_increases() {
        let prev = [(0.1, 5.0), (f64::INFINITY, 6.0)];
        let cur = [(0.1, 7.0), (1.0, 3.0), (f64::INFINITY, 10.0)];
        assert_eq!(
            bucket_deltas(&prev, &cur),
            vec![(0.1, 2.0), (1.0, 3.0), (f64::INFINITY, 4.0)]
        );
    }
}
