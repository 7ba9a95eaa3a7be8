//! Latency statistics and the report: a JSON file, a table, an SVG plot.

use std::time::Duration;

use serde_json::{json, Value};

/// Latencies of one measure, in milliseconds.
#[derive(Default, Clone)]
pub struct Samples(pub Vec<f64>);

impl Samples {
    /// Adds one sample.
    pub fn push(&mut self, elapsed: Duration) {
        self.0.push(elapsed.as_secs_f64() * 1000.0);
    }

    fn sorted(&self) -> Vec<f64> {
        let mut sorted = self.0.clone();
        sorted.sort_by(|a, b| a.total_cmp(b));
        sorted
    }

    /// The `q` quantile (0..=1).
    pub fn quantile(&self, q: f64) -> f64 {
        let sorted = self.sorted();
        if sorted.is_empty() {
            return f64::NAN;
        }
        let index = ((sorted.len() - 1) as f64 * q).round() as usize;
        sorted[index]
    }

    /// Median, p99 and max as JSON.
    pub fn summary(&self) -> Value {
        json!({
            "count": self.0.len(),
            "p50_ms": round(self.quantile(0.5)),
            "p99_ms": round(self.quantile(0.99)),
            "max_ms": round(self.quantile(1.0)),
        })
    }
}

/// Two decimals.
pub fn round(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

/// A cumulative distribution plot of latencies as SVG.
pub fn cdf_svg(title: &str, samples: &Samples) -> String {
    let sorted = samples.sorted();
    let (width, height, margin) = (640.0, 360.0, 50.0);
    let max = sorted.last().copied().unwrap_or(1.0).max(1.0);
    let n = sorted.len().max(1) as f64;
    let points: Vec<String> = sorted
        .iter()
        .enumerate()
        .map(|(i, ms)| {
            let x = margin + ms / max * (width - 2.0 * margin);
            let y = height - margin - (i as f64 + 1.0) / n * (height - 2.0 * margin);
            format!("{x:.1},{y:.1}")
        })
        .collect();
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\
<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
<text x=\"{margin}\" y=\"24\" font-size=\"14\">{title}</text>\
<line x1=\"{margin}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/>\
<line x1=\"{margin}\" y1=\"{margin}\" x2=\"{margin}\" y2=\"{b}\" stroke=\"black\"/>\
<text x=\"{margin}\" y=\"{lx}\">0 ms</text><text x=\"{rr}\" y=\"{lx}\">{max:.1} ms</text>\
<text x=\"8\" y=\"{margin}\">100%</text><text x=\"8\" y=\"{b}\">0%</text>\
<polyline fill=\"none\" stroke=\"#c0392b\" stroke-width=\"2\" points=\"{points}\"/>\
<text x=\"{mid}\" y=\"{lx}\">p50 {p50:.1} ms, p99 {p99:.1} ms, n={count}</text></svg>\n",
        b = height - margin,
        r = width - margin,
        rr = width - margin - 40.0,
        lx = height - margin + 20.0,
        mid = width / 2.0 - 80.0,
        points = points.join(" "),
        p50 = samples.quantile(0.5),
        p99 = samples.quantile(0.99),
        count = sorted.len(),
    )
}
